//! Network edge of a shard: listeners, connection loops, frames in and out.
//!
//! Owns sockets and per-connection bounds (buffer size, in-flight requests,
//! waiting requests, idle/frame/write timeouts), fair admission of requests
//! across the connections of a shard ([`admission`]: turns and rounds), the
//! consumer pace that holds enqueues while consumers are behind ([`pace`]), and
//! the counted, rate-limited report of every rejection. It does not decode the Spool protocol: the
//! codec plugs in through [`connection::FrameHandler`] (`server/` is the
//! Spool one, [`echo`] the one its tests use). One of the four places
//! allowed to name glommio (with `io/`, `server/` and the shard bootstrap).

pub mod accept_stats;
pub mod admission;
pub mod connection;
pub mod echo;
mod frame_handler;
pub mod listener;
pub mod memory;
pub mod pace;
pub mod peer;
pub mod peer_watch;
pub mod poll_gate;
pub mod rejections;
mod scope;
pub mod stop;
pub mod tls;
mod writer;

pub use admission::Admission;
pub use connection::{
    serve, serve_connection, Connection, ConnectionEnd, ConnectionLimits, Decoded, FrameHandler,
    ProtocolFault, Refusal,
};
pub use rejections::Rejections;
pub use stop::StopSignal;
