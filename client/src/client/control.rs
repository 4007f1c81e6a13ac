//! Catalog changes (create a queue, delete a queue) sent where they are
//! served: [`Client::catalog_call`].
//!
//! A single broker serves them on its bootstrap shard. In a cluster only the
//! controller's leader does; every other node answers `NOT_OWNER` naming
//! the leader's shard-0 client address when it knows one, and without an
//! owner while the controller has no leader (an election runs). So the call
//! starts at the bootstrap address, follows each named owner (at most
//! [`ROUTE_ATTEMPTS_MAX`] such answers), and while no owner is named it waits
//! (from [`LEADER_WAIT_BACKOFF`], doubling up to
//! [`LEADER_WAIT_BACKOFF_MAX`]) and asks the same node again, at most
//! [`LEADER_WAIT_ATTEMPTS_MAX`] times. A named owner that cannot be reached
//! (it may have just died) counts as such a wait and sends the next attempt
//! to the bootstrap address again. Any other answer, or a failure after the
//! request was sent (its outcome unknown), ends the call: a refused
//! request changed nothing, so resending it is safe; an unanswered one is
//! not resent.

use std::time::Duration;

use spool_wire::proto::Request;

use super::{address, Client};
use crate::connection::ResponseBytes;
use crate::error::ClientError;
use crate::limits::{
    LEADER_WAIT_ATTEMPTS_MAX, LEADER_WAIT_BACKOFF, LEADER_WAIT_BACKOFF_MAX, ROUTE_ATTEMPTS_MAX,
};

/// The pause before the `wait`-th resend (1-based) while no leader is
/// known, the first being `first`.
pub(super) fn leader_wait(first: Duration, wait: u32) -> Duration {
    let factor = 1u32 << wait.saturating_sub(1).min(16);
    first.saturating_mul(factor).min(LEADER_WAIT_BACKOFF_MAX)
}

impl Client {
    /// Sends a catalog change (`operation` names it in errors) to the node
    /// that serves it, following `NOT_OWNER` (see the module doc).
    ///
    /// # Errors
    /// The request's own error; [`ClientError::ControlRouteExhausted`] when
    /// `NOT_OWNER` outlasted the bounds; a connect failure at the bootstrap
    /// address.
    pub(crate) async fn catalog_call(
        &self,
        operation: &str,
        request: &Request<'_>,
    ) -> Result<ResponseBytes, ClientError> {
        self.catalog_call_pacing(operation, request, LEADER_WAIT_BACKOFF).await
    }

    /// [`catalog_call`](Self::catalog_call) whose first wait for a leader
    /// is `first_wait` (the tests' is short).
    pub(super) async fn catalog_call_pacing(
        &self,
        operation: &str,
        request: &Request<'_>,
        first_wait: Duration,
    ) -> Result<ResponseBytes, ClientError> {
        let bootstrap = self.bootstrap().to_owned();
        let mut addr = bootstrap.clone();
        let (mut hops, mut waits, mut sent) = (0u32, 0u32, 0u32);
        loop {
            let answer = match self.connection(&addr).await {
                Ok(connection) => {
                    sent += 1;
                    connection.call(request).await
                }
                // The owner a node named is gone: ask the bootstrap again
                // once a leader had time to be elected.
                Err(error) if addr != bootstrap => {
                    Err(ClientError::NotOwner { message: error.to_string(), owner: None })
                }
                Err(error) => return Err(error),
            };
            let exhausted = |attempts: u32, message: String| ClientError::ControlRouteExhausted {
                operation: operation.to_owned(),
                attempts,
                message,
            };
            match answer {
                Err(
                    ClientError::NotOwner { owner: Some(owner), message }
                    | ClientError::NotLeader { leader: Some(owner), message },
                ) => {
                    hops += 1;
                    if hops >= ROUTE_ATTEMPTS_MAX {
                        return Err(exhausted(sent, message));
                    }
                    let next = address(&owner.host, owner.port);
                    tracing::debug!(%operation, %addr, %next, %message, "not the controller leader; following");
                    addr = next;
                }
                Err(
                    ClientError::NotOwner { owner: None, message }
                    | ClientError::NotLeader { leader: None, message },
                ) => {
                    waits += 1;
                    if waits >= LEADER_WAIT_ATTEMPTS_MAX {
                        return Err(exhausted(sent, message));
                    }
                    let pause = leader_wait(first_wait, waits);
                    tracing::debug!(%operation, %addr, %message, ?pause, "no controller leader known; waiting");
                    // Time is what is waited for here: an election.
                    tokio::time::sleep(pause).await;
                    if self.connection_is_closed(&addr).await {
                        addr = bootstrap.clone();
                    }
                }
                other => return other,
            }
        }
    }

    /// Whether no open connection to `addr` is held (it closed, or its
    /// connect failed).
    async fn connection_is_closed(&self, addr: &str) -> bool {
        let connections = self.inner.connections.lock().await;
        connections.get(addr).is_none_or(crate::Connection::is_closed)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::leader_wait;
    use crate::limits::{LEADER_WAIT_BACKOFF, LEADER_WAIT_BACKOFF_MAX};

    #[test]
    fn leader_waits_double_up_to_their_bound() {
        assert_eq!(leader_wait(LEADER_WAIT_BACKOFF, 1), Duration::from_millis(100));
        assert_eq!(leader_wait(LEADER_WAIT_BACKOFF, 2), Duration::from_millis(200));
        assert_eq!(leader_wait(LEADER_WAIT_BACKOFF, 40), LEADER_WAIT_BACKOFF_MAX);
    }
}
