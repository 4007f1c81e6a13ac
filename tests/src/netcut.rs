//! A relay between the peer ports of a test cluster's nodes that the test
//! can cut: a network partition on one machine, with no namespaces and
//! nothing bound outside 127.0.0.1.
//!
//! Every directed pair of nodes (A → B) gets its own block of relay ports,
//! one per peer port of B (its shards' and its controller's): node A's
//! config names those as B's peer addresses, B listens on its real ones,
//! and each connection A opens to the relay is forwarded to B. A cut link
//! severs its open connections (the peers see them reset) and then holds
//! every new one open without forwarding a byte (a blackhole: the
//! connection is up, nothing arrives), so a node cut off keeps running and
//! serving its clients while its peers hear nothing from it. Healing
//! closes the held connections, so both sides reconnect through a link
//! that forwards again.
//!
//! Threads, not tasks: the relay outlives any one test runtime and works
//! the same under a blocking test.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

/// How often an accept loop looks for a new connection and for its stop.
const ACCEPT_POLL: Duration = Duration::from_millis(5);

/// Bytes a forwarding thread moves per read.
const COPY_BUFFER_BYTES: usize = 64 * 1024;

/// One directed link's state, shared with its threads.
#[derive(Default)]
struct LinkState {
    cut: AtomicBool,
    /// Connections of this link (both sides of each forwarded one, the
    /// accepted side of each held one): shut down on a cut or a heal.
    open: Mutex<Vec<TcpStream>>,
}

impl LinkState {
    fn sever(&self) {
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        for stream in open.drain(..) {
            // Already closed by its peer is as good.
            let _ = stream.shutdown(Shutdown::Both);
        }
    }

    fn keep(&self, stream: &TcpStream) {
        if let Ok(clone) = stream.try_clone() {
            self.open.lock().unwrap_or_else(PoisonError::into_inner).push(clone);
        }
    }
}

/// One relayed port: connections from node `from` to node `to`'s peer
/// port `target`.
struct Link {
    from: u32,
    to: u32,
    state: Arc<LinkState>,
}

/// The relays of a cluster's peer links (module docs).
pub struct PeerRelay {
    links: Vec<Link>,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl PeerRelay {
    /// Starts a relay for each `(from, to, listen_port, target_port)`.
    ///
    /// # Errors
    /// A listen port that does not bind.
    pub fn start(routes: &[(u32, u32, u16, u16)]) -> std::io::Result<PeerRelay> {
        let stop = Arc::new(AtomicBool::new(false));
        let mut relay = PeerRelay { links: Vec::new(), stop: stop.clone(), threads: Vec::new() };
        for &(from, to, listen, target) in routes {
            let listener = TcpListener::bind(("127.0.0.1", listen))?;
            listener.set_nonblocking(true)?;
            let state = Arc::new(LinkState::default());
            relay.links.push(Link { from, to, state: state.clone() });
            let stop = stop.clone();
            relay
                .threads
                .push(std::thread::spawn(move || accept_loop(&listener, target, &state, &stop)));
        }
        Ok(relay)
    }

    /// Cuts every link to and from node `node`.
    pub fn cut_node(&self, node: u32) {
        for link in self.links.iter().filter(|link| link.from == node || link.to == node) {
            link.state.cut.store(true, Ordering::SeqCst);
            link.state.sever();
        }
    }

    /// Heals every link: held connections are closed, new ones forward.
    pub fn heal(&self) {
        for link in &self.links {
            if link.state.cut.swap(false, Ordering::SeqCst) {
                link.state.sever();
            }
        }
    }
}

impl std::fmt::Debug for PeerRelay {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let cut: Vec<(u32, u32)> = self
            .links
            .iter()
            .filter(|link| link.state.cut.load(Ordering::SeqCst))
            .map(|link| (link.from, link.to))
            .collect();
        formatter
            .debug_struct("PeerRelay")
            .field("links", &self.links.len())
            .field("cut", &cut)
            .finish()
    }
}

impl Drop for PeerRelay {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        for link in &self.links {
            link.state.sever();
        }
        for thread in self.threads.drain(..) {
            // A relay thread that panicked has nothing left to release.
            let _ = thread.join();
        }
    }
}

fn accept_loop(listener: &TcpListener, target: u16, state: &Arc<LinkState>, stop: &AtomicBool) {
    while !stop.load(Ordering::SeqCst) {
        match listener.accept() {
            Ok((inbound, _)) => {
                // Accepted sockets inherit nothing from the listener here,
                // but say it: the copy threads block.
                let _ = inbound.set_nonblocking(false);
                state.keep(&inbound);
                if state.cut.load(Ordering::SeqCst) {
                    // Held: open, silent, closed at the heal.
                    continue;
                }
                let Ok(outbound) = TcpStream::connect(("127.0.0.1", target)) else {
                    // The node is down: the connection ends as a refused one would.
                    let _ = inbound.shutdown(Shutdown::Both);
                    continue;
                };
                state.keep(&outbound);
                forward(inbound, outbound, state);
            }
            Err(error) if error.kind() == ErrorKind::WouldBlock => std::thread::sleep(ACCEPT_POLL),
            Err(_) => std::thread::sleep(ACCEPT_POLL),
        }
    }
}

/// Copies both ways until either side ends or the link is cut.
fn forward(inbound: TcpStream, outbound: TcpStream, state: &Arc<LinkState>) {
    let pairs =
        [(inbound.try_clone(), outbound.try_clone()), (outbound.try_clone(), inbound.try_clone())];
    for pair in pairs {
        let (Ok(mut reader), Ok(mut writer)) = pair else {
            let _ = inbound.shutdown(Shutdown::Both);
            let _ = outbound.shutdown(Shutdown::Both);
            return;
        };
        let state = state.clone();
        std::thread::spawn(move || {
            let mut buffer = vec![0u8; COPY_BUFFER_BYTES];
            loop {
                let read = match reader.read(&mut buffer) {
                    Ok(0) | Err(_) => break,
                    Ok(read) => read,
                };
                if state.cut.load(Ordering::SeqCst) || writer.write_all(&buffer[..read]).is_err() {
                    break;
                }
            }
            let _ = reader.shutdown(Shutdown::Both);
            let _ = writer.shutdown(Shutdown::Both);
        });
    }
}
