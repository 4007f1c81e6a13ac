//! Network edge of a shard: listeners, connection loops, frames in and out.
//!
//! Owns sockets and per-connection bounds (buffer size, in-flight requests,
//! idle/frame/write timeouts). It does not decode the Spool protocol: the
//! codec plugs in through [`connection::FrameHandler`]. One of the three
//! places allowed to name glommio (with `io/` and the shard bootstrap).

pub mod connection;
pub mod echo;
pub mod listener;
pub mod stop;

pub use connection::{
    serve_connection, ConnectionEnd, ConnectionLimits, Decoded, FrameHandler, ProtocolFault,
};
pub use stop::StopSignal;
