//! A shard's listening socket and accept loop.
//!
//! Owns the port check before binding, the accept loop and the per-shard
//! connection limit: a connection over it is told why
//! (`TOO_MANY_CONNECTIONS`, from the handler's refusal response) before it
//! is closed, and the refusal is counted and logged (rate-limited); how
//! each served connection ended is counted per reason
//! ([`ConnectionEnd::reason`]: `slow_reader` for one closed at
//! `write_timeout`) and logged. Each accepted connection runs
//! [`serve_connection`](crate::net::connection::serve_connection) as a task
//! inside a glommio `Gate`, so the shard can wait for every connection to
//! drain on shutdown. It does not choose ports (the shard does: base port +
//! shard index) and knows nothing of the protocol.
//!
//! glommio's `TcpListener::bind` always sets SO_REUSEPORT, so binding a port
//! another broker already listens on *succeeds* and silently splits its
//! traffic; and it does not set SO_REUSEADDR, so the connections it accepts
//! (which inherit the flag) leave TIME_WAIT / FIN_WAIT2 sockets that make
//! the port unbindable for a minute after a restart. [`bind_listener`]
//! therefore binds a std listener (SO_REUSEADDR, no SO_REUSEPORT: exclusive,
//! and restartable at once) and hands its fd to glommio.

use std::net::SocketAddr;
use std::rc::Rc;
use std::time::Duration;

use futures_lite::future::or;
use glommio::net::TcpListener;
use glommio::sync::Gate;
use thiserror::Error;

use futures_lite::{AsyncReadExt, AsyncWriteExt};

use crate::limits::{
    ACCEPT_ERROR_BACKOFF, LISTEN_BACKLOG, REFUSALS_IN_FLIGHT_MAX, REFUSAL_DRAIN_BYTES_MAX,
    REFUSAL_LINGER,
};
pub use crate::net::accept_stats::AcceptStats;
use crate::net::connection::{
    serve, Connection, ConnectionEnd, ConnectionLimits, FrameHandler, Refusal,
};
use crate::net::stop::StopSignal;

/// Rejection reason: a connection over `connections_per_shard_max`.
pub const REJECT_TOO_MANY_CONNECTIONS: &str = "too_many_connections";

/// Listening failures.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum NetError {
    #[error("port {addr} is already in use by another process (another spoold?)")]
    PortInUse { addr: SocketAddr },
    #[error("cannot bind {addr}: {source}")]
    Bind { addr: SocketAddr, source: std::io::Error },
}

/// Fails if anything already listens on `addr`. Binds and drops a std
/// listener, which does not set SO_REUSEPORT and so cannot share the port.
///
/// # Errors
/// [`NetError::PortInUse`] on EADDRINUSE, [`NetError::Bind`] otherwise.
pub fn check_port_free(addr: SocketAddr) -> Result<(), NetError> {
    match std::net::TcpListener::bind(addr) {
        Ok(probe) => {
            drop(probe);
            Ok(())
        }
        Err(error) if error.kind() == std::io::ErrorKind::AddrInUse => {
            Err(NetError::PortInUse { addr })
        }
        Err(source) => Err(NetError::Bind { addr, source }),
    }
}

/// [`check_port_free`], retried for up to `patience` while the port is in
/// use: a SIGKILLed predecessor's listening sockets outlive it by a few
/// milliseconds, and a supervisor that restarts at once must not see the
/// start fail for that. The wait is logged (once when it begins, once when
/// the port came free). Production passes `PORT_IN_USE_RETRY_MS`.
///
/// # Errors
/// [`NetError::PortInUse`] when the port is still in use after `patience`,
/// [`NetError::Bind`] at once for any other bind error.
pub fn wait_port_free(addr: SocketAddr, patience: Duration) -> Result<(), NetError> {
    let started = crate::clock::instant_now();
    let pause = Duration::from_millis(crate::limits::PORT_IN_USE_RETRY_PAUSE_MS);
    let mut attempts = 0u32;
    loop {
        attempts += 1;
        match check_port_free(addr) {
            Ok(()) => {
                if attempts > 1 {
                    let waited_ms =
                        u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
                    tracing::info!(%addr, attempts, waited_ms, "port came free; binding");
                }
                return Ok(());
            }
            Err(NetError::PortInUse { .. }) if started.elapsed() < patience => {
                if attempts == 1 {
                    let patience_ms = u64::try_from(patience.as_millis()).unwrap_or(u64::MAX);
                    tracing::warn!(%addr, patience_ms,
                        "port still in use (a stopped predecessor's sockets?); retrying");
                }
                std::thread::sleep(pause);
            }
            Err(error) => return Err(error),
        }
    }
}

/// Binds the shard's listener: a std listener (SO_REUSEADDR, never
/// SO_REUSEPORT, so it fails with EADDRINUSE if anyone listens there, yet
/// binds at once over TIME_WAIT sockets of our previous run) handed to
/// glommio. Must run on the shard's executor.
///
/// # Errors
/// [`NetError::PortInUse`] on EADDRINUSE, [`NetError::Bind`] otherwise.
pub fn bind_listener(addr: SocketAddr) -> Result<TcpListener, NetError> {
    use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd};
    let listener = match std::net::TcpListener::bind(addr) {
        Ok(listener) => listener,
        Err(error) if error.kind() == std::io::ErrorKind::AddrInUse => {
            return Err(NetError::PortInUse { addr })
        }
        Err(source) => return Err(NetError::Bind { addr, source }),
    };
    // std listens with a backlog of 128; a second listen(2) on a listening
    // socket only raises the backlog.
    // SAFETY: listen(2) on a socket fd we own; no memory is passed.
    if unsafe { libc::listen(listener.as_raw_fd(), LISTEN_BACKLOG) } != 0 {
        return Err(NetError::Bind { addr, source: std::io::Error::last_os_error() });
    }
    // SAFETY: the fd is a bound, listening TCP socket whose ownership moves
    // to glommio (into_raw_fd gives it up), as `from_raw_fd` requires.
    Ok(unsafe { TcpListener::from_raw_fd(listener.into_raw_fd()) })
}

struct RefusingGuard(Rc<AcceptStats>);

impl Drop for RefusingGuard {
    fn drop(&mut self) {
        let refusing = self.0.refusing.get();
        assert!(refusing > 0);
        self.0.refusing.set(refusing - 1);
    }
}

/// Writes `response` to a refused connection, says it will send nothing
/// more, and drops what the peer sends until it closes, all within
/// [`REFUSAL_LINGER`]: the peer reads the error before the close.
async fn refuse(stream: glommio::net::TcpStream, response: impl AsRef<[u8]>) {
    let mut stream = stream;
    let told = async {
        stream.write_all(response.as_ref()).await?;
        stream.shutdown(std::net::Shutdown::Write).await?;
        let mut sink = [0u8; 4096];
        let mut drained = 0usize;
        while drained < REFUSAL_DRAIN_BYTES_MAX {
            let read = stream.read(&mut sink).await?;
            if read == 0 {
                break;
            }
            drained += read;
        }
        Ok::<(), std::io::Error>(())
    };
    let outcome = or(told, async {
        glommio::timer::sleep(REFUSAL_LINGER).await;
        Ok(())
    })
    .await;
    if let Err(error) = outcome {
        tracing::debug!(%error, "refused connection closed before its error frame");
    }
}

struct ActiveGuard(Rc<AcceptStats>);

impl Drop for ActiveGuard {
    fn drop(&mut self) {
        let active = self.0.active.get();
        assert!(active > 0);
        self.0.active.set(active - 1);
    }
}

/// Accepts until `stop` trips, serving each connection in `gate`. Over
/// `connections_max` live connections, a new one gets the handler's refusal
/// response (`TOO_MANY_CONNECTIONS`) and is closed, rather than queue in a
/// backlog forever; each refusal is counted and logged (rate-limited).
/// Returns when the listener is dropped (stop); connections may still be
/// draining: close the gate to wait for them. With `tls`, every connection
/// is served over TLS ([`crate::net::tls::serve_tls`]) and a peer that does
/// not complete the handshake is closed.
#[allow(clippy::too_many_arguments)]
pub async fn accept_loop<H: FrameHandler>(
    listener: TcpListener,
    handler: Rc<H>,
    limits: ConnectionLimits,
    connections_max: usize,
    stop: StopSignal,
    gate: Gate,
    stats: Rc<AcceptStats>,
    tls: Option<crate::net::tls::TlsServer>,
) {
    loop {
        let accepted = or(async { Some(listener.accept().await) }, async {
            stop.wait().await;
            None
        })
        .await;
        let stream = match accepted {
            None => return,
            Some(Ok(stream)) => stream,
            Some(Err(error)) => {
                tracing::warn!(%error, "accept failed");
                glommio::timer::sleep(ACCEPT_ERROR_BACKOFF).await;
                continue;
            }
        };
        stats.accepted.set(stats.accepted.get() + 1);
        if stats.active.get() >= connections_max {
            stats.refused_over_limit.set(stats.refused_over_limit.get() + 1);
            stats.rejections.record(
                REJECT_TOO_MANY_CONNECTIONS,
                &format_args!(
                    "connection from {:?} refused: shard at connections_per_shard_max = {connections_max}",
                    stream.peer_addr().ok()
                ),
            );
            let response =
                handler.refusal_response(Refusal::TooManyConnections { connections_max });
            match response {
                // A TLS port has no plain frame to send before the
                // handshake: the connection is just closed.
                Some(response)
                    if tls.is_none() && stats.refusing.get() < REFUSALS_IN_FLIGHT_MAX =>
                {
                    stats.refusing.set(stats.refusing.get() + 1);
                    let guard = RefusingGuard(stats.clone());
                    let spawned = gate.spawn(async move {
                        refuse(stream, response).await;
                        drop(guard);
                    });
                    match spawned {
                        Ok(task) => {
                            task.detach();
                        }
                        Err(error) => {
                            unreachable!("connection gate closed while accepting: {error}")
                        }
                    }
                }
                _ => drop(stream),
            }
            continue;
        }
        if let Err(error) = stream.set_nodelay(true) {
            tracing::debug!(%error, "set_nodelay failed");
        }
        let peer = stream.peer_addr().ok();
        stats.active.set(stats.active.get() + 1);
        let guard = ActiveGuard(stats.clone());
        let scope = Rc::new(Connection::new(limits.waiting_max, stats.rejections.clone()));
        scope.set_peer_ip(peer.map(|addr| addr.ip()));
        let fd = std::os::fd::AsRawFd::as_raw_fd(&stream);
        scope.set_peer_watch(match tls {
            None => crate::net::peer_watch::PeerWatch::plain(fd),
            Some(_) => crate::net::peer_watch::PeerWatch::tls(fd),
        });
        let handler = handler.clone();
        let stop = stop.clone();
        let tls = tls.clone();
        let end_stats = stats.clone();
        let spawned = gate.spawn(async move {
            let end = match tls {
                None => serve(stream, handler, limits, stop, scope).await,
                Some(tls) => {
                    crate::net::tls::serve_tls(
                        stream, &tls, handler, limits, stop, scope, &end_stats,
                    )
                    .await
                }
            };
            end_stats.count_end(&end);
            log_connection_end(peer, &end);
            drop(guard);
        });
        match spawned {
            Ok(task) => {
                task.detach();
            }
            // The gate closes only after this loop returns.
            Err(error) => unreachable!("connection gate closed while accepting: {error}"),
        }
    }
}

/// Logs why a connection ended, with its reason label (the one
/// `spool_shard_connections_closed_total` counts it under): the ordinary
/// ends at debug, the others (a slow reader closed at `write_timeout`
/// among them) at info.
fn log_connection_end(peer: Option<SocketAddr>, end: &ConnectionEnd) {
    let reason = end.reason();
    match end {
        ConnectionEnd::PeerClosed | ConnectionEnd::Stopped | ConnectionEnd::Idle => {
            tracing::debug!(?peer, reason, ?end, "connection closed")
        }
        _ => tracing::info!(?peer, reason, ?end, "connection closed"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: a port that comes free within the patience is waited for, one
    // that stays taken fails after the patience, not sooner. Method: hold a
    // port with a std listener and drop it from another thread after 150 ms;
    // then hold one for good.
    #[test]
    fn a_port_in_use_is_retried_until_free_or_the_patience_ends() {
        let holder = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = holder.local_addr().unwrap();
        let started = crate::clock::instant_now();
        let release = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(150));
            drop(holder);
        });
        wait_port_free(addr, Duration::from_secs(5)).expect("free after the holder left");
        assert!(started.elapsed() >= Duration::from_millis(140), "{:?}", started.elapsed());
        release.join().unwrap();

        let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = held.local_addr().unwrap();
        let started = crate::clock::instant_now();
        let error = wait_port_free(addr, Duration::from_millis(200)).unwrap_err();
        assert!(matches!(error, NetError::PortInUse { .. }), "{error}");
        assert!(started.elapsed() >= Duration::from_millis(200));
        drop(held);
    }

    // Goal: the port check refuses a port someone listens on, even when that
    // listener set SO_REUSEPORT (which is how glommio binds). Method: bind a
    // glommio listener, then check the same port.
    #[test]
    fn port_check_refuses_a_reuseport_listener() {
        let executor = glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
            .make()
            .expect("executor");
        executor.run(async {
            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = listener.local_addr().unwrap();
            assert!(
                matches!(check_port_free(addr), Err(NetError::PortInUse { addr: a }) if a == addr)
            );
            drop(listener);
            check_port_free(addr).unwrap();
        });
    }

    // Goal: a shard's port is exclusive, yet a restarted shard can bind it at
    // once even though the previous run closed connections first (leaving
    // FIN_WAIT2 / TIME_WAIT sockets on the port). Method: accept a
    // connection, close our side while the peer keeps its socket open, drop
    // the listener, bind again; a second live bind is PortInUse.
    #[test]
    fn listener_is_exclusive_and_rebinds_over_closed_connections() {
        let executor = glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
            .make()
            .expect("executor");
        executor.run(async {
            let listener = bind_listener("127.0.0.1:0".parse().unwrap()).unwrap();
            let addr = listener.local_addr().unwrap();
            assert!(matches!(bind_listener(addr), Err(NetError::PortInUse { .. })));
            assert!(matches!(check_port_free(addr), Err(NetError::PortInUse { .. })));
            let peer = std::net::TcpStream::connect(addr).unwrap();
            let accepted = listener.accept().await.unwrap();
            drop(accepted); // our FIN first: our side waits in FIN_WAIT2
            drop(listener);
            check_port_free(addr).unwrap();
            let again = bind_listener(addr).unwrap();
            assert_eq!(again.local_addr().unwrap(), addr);
            drop(peer);
        });
    }
}
