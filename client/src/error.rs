//! The client's error type. A request fails in one of a few ways a caller
//! must tell apart: the broker answered with an [`ErrorCode`] (`NOT_OWNER`
//! names the owner), the network failed, the request timed out (outcome
//! unknown), or the peer broke the protocol. [`ClientError::is_retriable`]
//! says whether sending the same request again may succeed.

use crate::limits::REFUSED_LISTED_MAX;
use spool_wire::proto::{DeliveryToken, NodeAddress, ProtoError};
use spool_wire::{ErrorCode, WireError};
use thiserror::Error;

/// Everything a client operation can fail with.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ClientError {
    /// The broker refused the request with a stable code.
    #[error("{}: {message}", code.name())]
    Server {
        /// Never `NONE`, `NOT_OWNER` nor `NOT_LEADER` (those are
        /// [`ClientError::NotOwner`] and [`ClientError::NotLeader`]).
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
    /// The node holds a replica of the partition (or of the cluster's
    /// catalog) but does not lead it; `leader` is where the leader serves
    /// (when the node knows one). The client follows it as it follows
    /// [`ClientError::NotOwner`].
    #[error("NOT_LEADER: {message}{}", owner_suffix(.leader))]
    NotLeader {
        /// The broker's explanation.
        message: String,
        /// The leader's address.
        leader: Option<NodeAddress>,
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
    /// The TLS handshake failed (the certificate was refused, or the port
    /// does not speak TLS: see the reason).
    #[error("TLS handshake with {addr} failed: {reason}")]
    Tls {
        /// The peer.
        addr: String,
        /// Why.
        reason: String,
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
    /// A catalog change (create or delete a queue) still met `NOT_OWNER`
    /// after following the owners it named [`ROUTE_ATTEMPTS_MAX`] times,
    /// or after waiting [`LEADER_WAIT_ATTEMPTS_MAX`] times for a
    /// controller leader to be known.
    ///
    /// [`ROUTE_ATTEMPTS_MAX`]: crate::limits::ROUTE_ATTEMPTS_MAX
    /// [`LEADER_WAIT_ATTEMPTS_MAX`]: crate::limits::LEADER_WAIT_ATTEMPTS_MAX
    #[error("NOT_OWNER: {operation} still refused after {attempts} attempts (last: {message})")]
    ControlRouteExhausted {
        /// What was asked (`create queue`, `delete queue`).
        operation: String,
        /// Requests sent.
        attempts: u32,
        /// The last refusal's explanation.
        message: String,
    },
    /// The broker answered an Ack but refused some of its tokens (the
    /// others are acked): `STALE_TOKEN` after a lost lease, `INVALID_TOKEN`
    /// for a token of another queue or partition, and so on. A refused
    /// delivery was not acked; whether it runs again is the broker's lease
    /// logic, not this client's.
    #[error("{}: {} of {tokens} acks refused ({})", first_code(.refused), .refused.len(), refused_list(.refused))]
    AckRefused {
        /// The refused tokens, in request order (never empty).
        refused: Vec<RefusedAck>,
        /// Tokens in the request; `tokens - refused.len()` were acked.
        tokens: usize,
    },
    /// The component was shut down.
    #[error("shut down")]
    Shutdown,
    /// `QUOTA_EXCEEDED`: the principal's quota (an enqueue rate, or claims
    /// in flight) is used up on the shard that answered. Retriable: the
    /// same request may succeed after [`ClientError::retry_after`].
    #[error("QUOTA_EXCEEDED: {message}")]
    QuotaExceeded {
        /// The broker's explanation (names the quota).
        message: String,
        /// The broker's hint: when the quota will have room again (for
        /// claims, when the earliest lease runs out; an ack frees room
        /// sooner).
        retry_after: Option<std::time::Duration>,
    },
}

/// One token of an Ack request that the broker refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RefusedAck {
    /// Its position in the request's token list.
    pub index: usize,
    /// The token.
    pub token: DeliveryToken,
    /// Why (never `NONE`).
    pub code: ErrorCode,
}

fn first_code(refused: &[RefusedAck]) -> &'static str {
    refused.first().map_or("NONE", |refused| refused.code.name())
}

fn refused_list(refused: &[RefusedAck]) -> String {
    let mut text = refused
        .iter()
        .take(REFUSED_LISTED_MAX)
        .map(|refused| format!("token {}: {}", refused.index, refused.code.name()))
        .collect::<Vec<_>>()
        .join(", ");
    if refused.len() > REFUSED_LISTED_MAX {
        text.push_str(&format!(", and {} more", refused.len() - REFUSED_LISTED_MAX));
    }
    text
}

fn owner_suffix(owner: &Option<NodeAddress>) -> String {
    owner.as_ref().map_or(String::new(), |owner| format!(" (owner {}:{})", owner.host, owner.port))
}

impl ClientError {
    /// The stable wire code this error corresponds to, if it came from (or
    /// maps onto) one: the broker's code, `NOT_OWNER`, `NOT_LEADER`, `TIMEOUT` or
    /// `QUEUE_NOT_FOUND`; for [`AckRefused`](Self::AckRefused) the code of
    /// the first refused token.
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            Self::Server { code, .. } => Some(*code),
            Self::QuotaExceeded { .. } => Some(ErrorCode::QuotaExceeded),
            Self::AckRefused { refused, .. } => refused.first().map(|refused| refused.code),
            Self::NotOwner { .. }
            | Self::RouteExhausted { .. }
            | Self::ControlRouteExhausted { .. } => Some(ErrorCode::NotOwner),
            Self::NotLeader { .. } => Some(ErrorCode::NotLeader),
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
            | Self::NotLeader { .. }
            | Self::QuotaExceeded { .. }
            | Self::Io { .. }
            | Self::ConnectionClosed { .. }
            | Self::Timeout { .. } => true,
            Self::AckRefused { refused, .. } => {
                refused.iter().all(|refused| refused.code.is_retriable())
            }
            _ => false,
        }
    }

    /// How long to wait before sending the same request again, when the
    /// broker said ([`QuotaExceeded`](Self::QuotaExceeded)).
    pub fn retry_after(&self) -> Option<std::time::Duration> {
        match self {
            Self::QuotaExceeded { retry_after, .. } => *retry_after,
            _ => None,
        }
    }

    /// The codes of the refused tokens of an [`AckRefused`](Self::AckRefused)
    /// (empty for every other error).
    ///
    /// ```
    /// use spool_client::{ClientError, RefusedAck};
    /// use spool_client::spool_wire::proto::DeliveryToken;
    /// use spool_client::spool_wire::ErrorCode;
    ///
    /// let token = DeliveryToken([0; spool_client::spool_wire::proto::DELIVERY_TOKEN_BYTES]);
    /// let error = ClientError::AckRefused {
    ///     refused: vec![RefusedAck { index: 1, token, code: ErrorCode::StaleToken }],
    ///     tokens: 2,
    /// };
    /// assert_eq!(error.refused_codes(), vec![ErrorCode::StaleToken]);
    /// assert_eq!(error.code(), Some(ErrorCode::StaleToken));
    /// assert_eq!(error.to_string(), "STALE_TOKEN: 1 of 2 acks refused (token 1: STALE_TOKEN)");
    /// ```
    pub fn refused_codes(&self) -> Vec<ErrorCode> {
        match self {
            Self::AckRefused { refused, .. } => {
                refused.iter().map(|refused| refused.code).collect()
            }
            _ => Vec::new(),
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
        } else if code == ErrorCode::NotLeader {
            Self::NotLeader { message, leader: owner }
        } else if code == ErrorCode::QuotaExceeded {
            let retry_after = spool_wire::codes::parse_retry_after_ms(&message)
                .map(std::time::Duration::from_millis);
            Self::QuotaExceeded { message, retry_after }
        } else {
            Self::Server { code, message }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: QUOTA_EXCEEDED becomes the typed error, retriable, with the
    // broker's hint read from its message.
    #[test]
    fn quota_refusals_are_typed_with_their_hint() {
        let error = ClientError::from_response(
            ErrorCode::QuotaExceeded,
            "quota enqueue_messages_per_sec = 4 of principal p used up; retry after 250 ms"
                .to_owned(),
            None,
        );
        assert!(matches!(error, ClientError::QuotaExceeded { .. }));
        assert_eq!(error.code(), Some(ErrorCode::QuotaExceeded));
        assert!(error.is_retriable());
        assert_eq!(error.retry_after(), Some(std::time::Duration::from_millis(250)));
        assert!(error.to_string().starts_with("QUOTA_EXCEEDED: quota enqueue_messages_per_sec"));
    }
}
