//! A shard's listening socket and accept loop.
//!
//! Owns the port check before binding, the accept loop and the per-shard
//! connection limit. Each accepted connection runs
//! [`serve_connection`](crate::net::connection::serve_connection) as a task
//! inside a glommio `Gate`, so the shard can wait for every connection to
//! drain on shutdown. It does not choose ports (the shard does: base port +
//! shard index) and knows nothing of the protocol.
//!
//! glommio's `TcpListener::bind` always sets SO_REUSEPORT, so binding a port
//! another broker already listens on *succeeds* and silently splits its
//! traffic; and it does not set SO_REUSEADDR, so a killed broker's
//! connections in TIME_WAIT block its restart. [`bind_listener`] therefore
//! binds a plain std listener (SO_REUSEADDR, no SO_REUSEPORT), which fails
//! with EADDRINUSE only if someone listens there, and hands it to glommio.

use std::cell::Cell;
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::Duration;

use futures_lite::future::or;
use glommio::net::TcpListener;
use glommio::sync::Gate;
use thiserror::Error;

use crate::net::connection::{serve_connection, ConnectionEnd, ConnectionLimits, FrameHandler};
use crate::net::stop::StopSignal;

/// Pause after a failed `accept` (EMFILE and friends) so the loop does not
/// spin while the condition lasts.
pub const ACCEPT_ERROR_BACKOFF: Duration = Duration::from_millis(10);

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

/// Binds the shard's listener with std (SO_REUSEADDR, no SO_REUSEPORT) and
/// hands the socket to glommio.
///
/// Not glommio's `TcpListener::bind`: it sets SO_REUSEPORT and not
/// SO_REUSEADDR, so every connection it accepts lacks SO_REUSEADDR, and when
/// the broker is killed those connections sit in TIME_WAIT on the shard port
/// for a minute; any later bind of that port (the restart's) then fails with
/// EADDRINUSE. With SO_REUSEADDR on the listener, accepted connections
/// inherit it and their TIME_WAIT no longer blocks a restart, while a live
/// listener (another spoold) still does: the bind itself is the port check.
///
/// # Errors
/// [`NetError::PortInUse`] on EADDRINUSE, [`NetError::Bind`] otherwise.
pub fn bind_listener(addr: SocketAddr) -> Result<TcpListener, NetError> {
    use std::os::unix::io::{FromRawFd, IntoRawFd};
    let listener = match std::net::TcpListener::bind(addr) {
        Ok(listener) => listener,
        Err(error) if error.kind() == std::io::ErrorKind::AddrInUse => {
            return Err(NetError::PortInUse { addr });
        }
        Err(source) => return Err(NetError::Bind { addr, source }),
    };
    // SAFETY: `into_raw_fd` gives up ownership of a bound, listening TCP
    // socket; glommio takes it over and closes it on drop.
    Ok(unsafe { TcpListener::from_raw_fd(listener.into_raw_fd()) })
}

/// Connection counters of one shard, readable from its executor.
#[derive(Debug, Default)]
pub struct AcceptStats {
    pub accepted: Cell<u64>,
    pub refused_over_limit: Cell<u64>,
    pub active: Cell<usize>,
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
/// `connections_max` live connections, a new one is closed at once: clients
/// see a reset and retry elsewhere, rather than queue in a backlog forever.
/// Returns when the listener is dropped (stop); connections may still be
/// draining: close the gate to wait for them.
pub async fn accept_loop<H: FrameHandler>(
    listener: TcpListener,
    handler: Rc<H>,
    limits: ConnectionLimits,
    connections_max: usize,
    stop: StopSignal,
    gate: Gate,
    stats: Rc<AcceptStats>,
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
            tracing::debug!(connections_max, "connection refused: shard at its connection limit");
            drop(stream);
            continue;
        }
        if let Err(error) = stream.set_nodelay(true) {
            tracing::debug!(%error, "set_nodelay failed");
        }
        let peer = stream.peer_addr().ok();
        stats.active.set(stats.active.get() + 1);
        let guard = ActiveGuard(stats.clone());
        let connection = serve_connection(stream, handler.clone(), limits, stop.clone());
        let spawned = gate.spawn(async move {
            let end = connection.await;
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

fn log_connection_end(peer: Option<SocketAddr>, end: &ConnectionEnd) {
    match end {
        ConnectionEnd::PeerClosed | ConnectionEnd::Stopped | ConnectionEnd::Idle => {
            tracing::debug!(?peer, ?end, "connection closed")
        }
        _ => tracing::info!(?peer, ?end, "connection closed"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
