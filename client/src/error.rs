//! The client's error type. A request fails in one of a few ways a caller
//! must tell apart: the broker answered with an [`ErrorCode`] (`NOT_OWNER`
//! names the owner), the network failed, the request timed out (outcome
//! unknown), or the peer broke the protocol. [`ClientError::is_retriable`]
//! says whether sending the same request again may succeed.

use spool_wire::proto::{NodeAddress, ProtoError};
use spool_wire::{ErrorCode, WireError};
use thiserror::Error;

/// Everything a client operation can fail with.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ClientError {
    /// The broker refused the request with a stable code.
    #[error("{}: {message}", code.name())]
    Server {
        /// Never `NONE` and never `NOT_OWNER` (that is [`ClientError::NotOwner`]).
        code: ErrorCode,
        /// The broker's explanation.
        message: String,
    },
    /// The shard does not own the partition; `owner` is where it lives (when
    /// the broker knows).
    #[error("NOT_OWNER: {message}{}", owner_suffix(.owner))]
    NotOwner {
        /// The broker's explanation.
        message: String,
        /// The owning shard.
        owner: Option<NodeAddress>,
    },
    /// A socket operation failed.
    #[error("I/O error with {addr}: {source}")]
    Io {
        /// The peer.
        addr: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The connection closed (or broke) with the request outstanding; its
    /// outcome is unknown.
    #[error("connection to {addr} closed: {reason}")]
    ConnectionClosed {
        /// The peer.
        addr: String,
        /// Why.
        reason: String,
    },
    /// No response within the request timeout; the outcome is unknown.
    #[error("TIMEOUT: no response within {timeout_ms} ms")]
    Timeout {
        /// The timeout that passed.
        timeout_ms: u64,
    },
    /// The peer sent bytes the codec rejects, or a response that does not
    /// answer the request; the connection is closed.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// A request could not be encoded (a field out of range).
    #[error("invalid request: {0}")]
    Encode(#[from] ProtoError),
    /// A record could not be built or read.
    #[error("record: {0}")]
    Record(#[from] WireError),
    /// The metadata names no such queue, or a queue without partitions.
    #[error("QUEUE_NOT_FOUND: queue '{0}' is not in the metadata")]
    UnknownQueue(String),
    /// A configuration value is out of range.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// `NOT_OWNER` kept coming back after the route limit.
    #[error(
        "NOT_OWNER: partition {partition} of '{queue}' still not owned after {attempts} attempts"
    )]
    RouteExhausted {
        /// Queue name.
        queue: String,
        /// Partition number.
        partition: u32,
        /// Attempts made.
        attempts: u32,
    },
    /// The component was shut down.
    #[error("shut down")]
    Shutdown,
}

fn owner_suffix(owner: &Option<NodeAddress>) -> String {
    owner.as_ref().map_or(String::new(), |owner| format!(" (owner {}:{})", owner.host, owner.port))
}

impl ClientError {
    /// The stable wire code this error corresponds to, if it came from (or
    /// maps onto) one: the broker's code, `NOT_OWNER`, `TIMEOUT` or
    /// `QUEUE_NOT_FOUND`.
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            Self::Server { code, .. } => Some(*code),
            Self::NotOwner { .. } | Self::RouteExhausted { .. } => Some(ErrorCode::NotOwner),
            Self::Timeout { .. } => Some(ErrorCode::Timeout),
            Self::UnknownQueue(_) => Some(ErrorCode::QueueNotFound),
            Self::Encode(error) => Some(error.code()),
            _ => None,
        }
    }

    /// Whether the same request may succeed if sent again: a retriable
    /// broker code, a broken connection or a timeout. Retrying is safe for
    /// enqueues because a retry reuses the message ids (the broker dedupes).
    pub fn is_retriable(&self) -> bool {
        match self {
            Self::Server { code, .. } => code.is_retriable(),
            Self::NotOwner { .. }
            | Self::Io { .. }
            | Self::ConnectionClosed { .. }
            | Self::Timeout { .. } => true,
            _ => false,
        }
    }

    /// Builds the error for a broker error response.
    pub(crate) fn from_response(
        code: ErrorCode,
        message: String,
        owner: Option<NodeAddress>,
    ) -> Self {
        if code == ErrorCode::NotOwner {
            Self::NotOwner { message, owner }
        } else {
            Self::Server { code, message }
        }
    }
}
