//! The contract between a connection loop and the protocol it carries: a
//! [`FrameHandler`] splits frames off the read buffer ([`Decoded`]), says
//! whether a frame is intake (for the consumer pace), admits and handles
//! frames, and says what to write on a protocol fault ([`ProtocolFault`]) or
//! to a connection refused on accept ([`Refusal`]). No I/O here: the loop
//! (`connection.rs`) does it.

use std::future::Future;
use std::rc::Rc;

use super::scope::Connection;

/// What a handler's decoder found at the front of the buffer.
#[derive(Debug, PartialEq, Eq)]
pub enum Decoded<F> {
    /// Not a whole frame yet; read more.
    Incomplete,
    /// A whole frame, `len_bytes` long from the start of the buffer.
    Frame { frame: F, len_bytes: usize },
}

/// A protocol-level reason to close the connection, handed to
/// [`FrameHandler::fault_response`] so the peer can be told why.
#[derive(Debug)]
pub enum ProtocolFault<'a, E> {
    /// The decoder rejected the bytes.
    Decode(&'a E),
    /// `frame_bytes_max` bytes are buffered and still no whole frame.
    FrameTooLarge { frame_bytes_max: usize },
    /// A started frame did not complete within the frame timeout.
    FrameTimeout,
}

/// The protocol plugged into the connection loop. One handler value serves
/// every connection of a shard (held in an `Rc`); it runs on the shard's
/// executor only, so it may hold `Rc`/`RefCell` state.
pub trait FrameHandler: 'static {
    /// A decoded request.
    type Frame: 'static;
    /// An encoded response, written as-is.
    type Response: AsRef<[u8]> + 'static;
    /// The decoder's error.
    type DecodeError: std::error::Error + 'static;

    /// Looks at the front of `buffer` (never empty) and says whether a whole
    /// frame is there. Must not block or allocate more than the frame; should
    /// reject a header announcing more than the configured frame size at
    /// once rather than wait for the bytes.
    ///
    /// # Errors
    /// The bytes can never become a valid frame; the connection is closed.
    fn decode(&self, buffer: &[u8]) -> Result<Decoded<Self::Frame>, Self::DecodeError>;

    /// Called in frame order for each decoded frame of `connection`, just
    /// before it becomes a task: the place for per-connection rules that
    /// depend on what came before (the authentication handshake). Admits
    /// every frame by default.
    ///
    /// # Errors
    /// The frame must not be served: the fault response for the error is
    /// written after the answers in flight and the connection is closed.
    fn admit(&self, frame: &Self::Frame, connection: &Connection) -> Result<(), Self::DecodeError> {
        let _ = (frame, connection);
        Ok(())
    }

    /// Handles one request and produces its response. Runs as its own task,
    /// concurrently with other requests of the same connection. A request
    /// that waits for something to happen (a claim long-poll) should end its
    /// wait when [`Connection::ended`] resolves and answer what it has.
    fn handle(
        self: Rc<Self>,
        frame: Self::Frame,
        connection: Rc<Connection>,
    ) -> impl Future<Output = Self::Response>;

    /// The whole length of the frame that starts `buffer`, once its header
    /// is there; `None` when the codec cannot tell yet (or at all). Used to
    /// know whether a peer that closed its sending side left a frame that
    /// can never complete ([`crate::net::peer_watch`]).
    fn frame_len(&self, buffer: &[u8]) -> Option<usize> {
        let _ = buffer;
        None
    }

    /// Whether the frame at the front of `buffer` (never empty, perhaps
    /// not whole) is intake — producer data that the shard's consumer pace
    /// may hold back ([`crate::net::pace`]). Must only peek at the header.
    /// None is, by default.
    fn is_intake(&self, buffer: &[u8]) -> bool {
        let _ = buffer;
        false
    }

    /// The response to write before closing on `fault`, if any.
    fn fault_response(&self, fault: ProtocolFault<'_, Self::DecodeError>)
        -> Option<Self::Response>;

    /// Called once, before the first frame, on a TLS connection whose
    /// client certificate was verified against the configured CA and names
    /// `principal` (its subject CN): the place to authenticate the
    /// connection as that principal. Ignores it by default.
    ///
    /// # Errors
    /// The connection must close: the response to write first, if any.
    fn certificate_principal(
        &self,
        principal: &str,
        connection: &Connection,
    ) -> Result<(), Option<Self::Response>> {
        let _ = (principal, connection);
        Ok(())
    }

    /// The response to write to a connection refused on accept, before it
    /// is closed (none by default).
    fn refusal_response(&self, refusal: Refusal) -> Option<Self::Response> {
        let _ = refusal;
        None
    }
}

/// Why a connection was refused on accept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The shard already serves `connections_max` connections.
    TooManyConnections { connections_max: usize },
}
