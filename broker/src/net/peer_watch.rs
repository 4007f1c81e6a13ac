//! Whether a connection's peer is gone, asked of its socket without reading
//! from it.
//!
//! A connection that waits for memory to grow its read buffer reads
//! nothing, so it would see its peer's close only at the frame deadline,
//! holding the memory it was granted until then. While it waits, the
//! connection loop asks the socket every [`MEMORY_WAIT_PEER_POLL`]
//! (`poll` with a zero timeout, and `FIONREAD`) whether:
//!
//! - the connection was reset or failed (`POLLHUP`, `POLLERR`): nothing
//!   more can come in or go out, the peer is gone;
//! - the peer closed its sending side (`POLLRDHUP`) and what it sent before
//!   (the bytes the socket holds, `FIONREAD`) cannot complete the frame the
//!   connection is reading: that frame can never be whole, the peer is gone.
//!   A half-close after a frame that the socket holds whole is not an end:
//!   that request is still read (when memory returns) and answered.
//!
//! The half-close rule needs the socket's bytes to be the connection's
//! bytes, which holds for plain TCP only: a TLS session buffers records of
//! its own, so over TLS only a reset or failure counts ([`PeerWatch::tls`]).
//!
//! What it cannot see: a peer whose close (FIN) is queued behind its own
//! unsent data, held back by this socket's closed window, sends nothing
//! until the window opens; that connection ends at its frame deadline (or
//! when the peer's kernel resets it), as a peer that trickles does.
//!
//! [`MEMORY_WAIT_PEER_POLL`]: crate::limits::MEMORY_WAIT_PEER_POLL

use std::os::fd::RawFd;

/// How a connection's socket is watched while the connection reads nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerWatch {
    fd: RawFd,
    /// The socket carries the connection's own bytes (plain TCP): a
    /// half-close can be weighed against the frame being read.
    plain: bool,
}

impl PeerWatch {
    /// A plain TCP connection's socket.
    pub fn plain(fd: RawFd) -> PeerWatch {
        PeerWatch { fd, plain: true }
    }

    /// A TLS connection's socket: only a reset or failure counts.
    pub fn tls(fd: RawFd) -> PeerWatch {
        PeerWatch { fd, plain: false }
    }

    /// Whether the peer is gone, given the connection holds `filled` bytes
    /// of the frame it is reading and that frame is `frame_len` bytes long
    /// (when its header has been read). Never blocks; a failed system call
    /// answers "not gone" (the frame deadline still ends the connection).
    pub fn gone(&self, filled: usize, frame_len: Option<usize>) -> bool {
        let mut poll = libc::pollfd { fd: self.fd, events: libc::POLLRDHUP, revents: 0 };
        // SAFETY: one valid pollfd, zero timeout; the fd is owned by the
        // connection's stream, which outlives this call.
        let ready = unsafe { libc::poll(&mut poll, 1, 0) };
        if ready <= 0 {
            return false;
        }
        if poll.revents & (libc::POLLHUP | libc::POLLERR | libc::POLLNVAL) != 0 {
            return true;
        }
        if !self.plain || poll.revents & libc::POLLRDHUP == 0 {
            return false;
        }
        let mut pending: libc::c_int = 0;
        // SAFETY: FIONREAD writes one c_int to the pointer given.
        if unsafe { libc::ioctl(self.fd, libc::FIONREAD, &mut pending) } != 0 {
            return false;
        }
        let pending = usize::try_from(pending).unwrap_or(0);
        match frame_len {
            // Nothing more will come: the frame is whole only if the socket
            // holds the rest of it.
            Some(len) => filled.saturating_add(pending) < len,
            // No header yet (not a state that waits for memory): gone when
            // nothing at all is left to read.
            None => pending == 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::{Shutdown, TcpListener, TcpStream};
    use std::os::fd::AsRawFd;
    use std::time::Duration;

    fn pair() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let client = TcpStream::connect(listener.local_addr().expect("addr")).expect("connect");
        let (server, _) = listener.accept().expect("accept");
        (client, server)
    }

    /// Polls until `watch` answers `expected` or a second passes (the
    /// kernel delivers a close asynchronously, even on loopback).
    fn settles(watch: PeerWatch, filled: usize, frame_len: Option<usize>, expected: bool) -> bool {
        let until = crate::clock::instant_now() + Duration::from_secs(1);
        loop {
            if watch.gone(filled, frame_len) == expected {
                return true;
            }
            if crate::clock::instant_now() > until {
                return false;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    #[test]
    fn an_open_peer_is_not_gone_with_or_without_bytes_waiting() {
        let (mut client, server) = pair();
        let watch = PeerWatch::plain(server.as_raw_fd());
        assert!(!watch.gone(100, Some(1000)));
        client.write_all(&[7; 300]).expect("write");
        std::thread::sleep(Duration::from_millis(50));
        assert!(!watch.gone(100, Some(1000)), "bytes waiting are not a close");
    }

    #[test]
    fn a_half_close_before_the_frame_is_whole_is_gone_after_it_is_not() {
        let (mut client, server) = pair();
        client.write_all(&[7; 300]).expect("write");
        client.shutdown(Shutdown::Write).expect("shutdown");
        let watch = PeerWatch::plain(server.as_raw_fd());
        // 100 read + 300 in the socket < 1000: the frame can never be whole.
        assert!(settles(watch, 100, Some(1000), true));
        // 100 + 300 = 400: the rest of the frame is in the socket.
        assert!(!watch.gone(100, Some(400)));
        assert!(!watch.gone(100, Some(350)));
        // Over TLS a half-close is never weighed.
        assert!(!PeerWatch::tls(server.as_raw_fd()).gone(100, Some(1000)));
    }

    #[test]
    fn a_half_close_with_nothing_left_and_no_header_is_gone() {
        let (client, server) = pair();
        client.shutdown(Shutdown::Write).expect("shutdown");
        assert!(settles(PeerWatch::plain(server.as_raw_fd()), 0, None, true));
    }

    #[test]
    fn a_reset_is_gone_over_plain_and_tls_alike() {
        let (client, mut server) = pair();
        server.write_all(&[1; 10]).expect("write");
        std::thread::sleep(Duration::from_millis(20));
        // Closing with unread bytes resets the connection.
        drop(client);
        let plain = PeerWatch::plain(server.as_raw_fd());
        let tls = PeerWatch::tls(server.as_raw_fd());
        assert!(settles(plain, 0, Some(1000), true));
        assert!(settles(tls, 0, Some(1000), true));
        let mut byte = [0u8; 1];
        assert!(server.read(&mut byte).is_err(), "the socket was reset");
    }
}
