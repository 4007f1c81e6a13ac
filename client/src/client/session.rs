//! Consumer sessions from the client's side (`docs/design/sessions.md`):
//! [`Client::open_session`] opens one on the connection to the shard that
//! leads a partition of the queue; a [`Session`] heartbeats and closes on
//! that same connection. Claims made on that connection for the session's
//! queue and subscription are the session's: the broker releases them at
//! once when the session ends.
//!
//! It must not retry or reopen: keeping a session alive across
//! reconnects is the consumer's (`consumer/session.rs`).

use spool_wire::proto::{PartitionId, Request, Response, SessionRequest};

use super::Client;
use crate::connection::Connection;
use crate::error::ClientError;

/// An open session on one connection.
#[derive(Debug, Clone)]
pub struct Session {
    connection: Connection,
    id: u64,
    epoch: u64,
    timeout_ms: u32,
}

impl Session {
    /// The session's id on its shard.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The member's epoch on the shard: above every earlier one.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The timeout in force.
    pub fn timeout_ms(&self) -> u32 {
        self.timeout_ms
    }

    /// Whether the session lives on `connection` (and it is open).
    pub fn is_on(&self, connection: &Connection) -> bool {
        self.connection.same(connection) && !connection.is_closed()
    }

    async fn call(&self, request: SessionRequest<'_>) -> Result<(), ClientError> {
        match self.connection.call(&Request::Session(request)).await?.response()? {
            Response::Session(_) => Ok(()),
            other => {
                Err(ClientError::Protocol(format!("Session answered with {:?}", other.api_key())))
            }
        }
    }

    /// "Still here": pushes the session's deadline its timeout out.
    ///
    /// # Errors
    /// `SESSION_NOT_FOUND` (it timed out, or its connection was replaced),
    /// `SESSION_FENCED` (the member opened a newer one),
    /// [`ClientError::ConnectionClosed`].
    pub async fn heartbeat(&self) -> Result<(), ClientError> {
        self.call(SessionRequest::Heartbeat { session_id: self.id }).await
    }

    /// Ends the session: whatever it still holds is released at once.
    ///
    /// # Errors
    /// As [`heartbeat`](Self::heartbeat).
    pub async fn close(&self) -> Result<(), ClientError> {
        self.call(SessionRequest::Close { session_id: self.id }).await
    }
}

impl Client {
    /// Opens a session of `member` for `queue` (its `subscription`, or the
    /// default one) on the connection to the shard that leads `via`, with
    /// `timeout_ms` between heartbeats at most.
    ///
    /// # Errors
    /// `INVALID_ARGUMENT` for a member or timeout out of bounds,
    /// `QUEUE_NOT_FOUND`, `SUBSCRIPTION_NOT_FOUND`, `THROTTLED` (the shard
    /// holds its most sessions), `UNKNOWN_API` from a broker that predates
    /// sessions; a connection failure.
    pub async fn open_session(
        &self,
        queue: &str,
        via: PartitionId,
        subscription: Option<&str>,
        member: &str,
        timeout_ms: u32,
    ) -> Result<Session, ClientError> {
        let addr = self.owner_address(queue, via).await?;
        let connection = self.connection(&addr).await?;
        let request = Request::Session(SessionRequest::Open {
            queue,
            subscription: subscription.unwrap_or(""),
            member,
            timeout_ms,
        });
        match connection.call(&request).await?.response()? {
            Response::Session(opened) => Ok(Session {
                connection: connection.clone(),
                id: opened.session_id,
                epoch: opened.epoch,
                timeout_ms: opened.timeout_ms,
            }),
            other => {
                Err(ClientError::Protocol(format!("Session answered with {:?}", other.api_key())))
            }
        }
    }
}
