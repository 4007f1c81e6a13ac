//! Ping (api key 8): a connection's proof of life. A client that has
//! requests outstanding and has heard nothing from the broker for a while
//! sends one; the broker answers it at once, without touching a partition,
//! the disk or another core, so the answer says the broker process reads and
//! writes this connection, whatever its other requests are waiting for
//! (`docs/design/protocol.md`, "Ping").
//!
//! Layout (hand-written, like the data path): both bodies are empty.
//!
//! ```text
//! request:  (no body)
//! response: (no body)
//! ```
//!
//! A broker that predates the key answers `UNKNOWN_API` with the request's
//! id: an error frame, which proves life just as well.

use super::codec::{Reader, Writer};
use super::error::ProtoError;

/// "Are you there?" Empty: the frame header is the whole request.
///
/// ```
/// use spool_wire::proto::{CorrelationId, PingRequest, Request};
/// let mut bytes = Vec::new();
/// Request::Ping(PingRequest {}).encode(CorrelationId(1), &mut bytes).unwrap();
/// assert_eq!(bytes.len(), 24, "a header and no body");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PingRequest {}

impl PingRequest {
    /// Nothing to check: the request has no fields.
    ///
    /// # Errors
    /// None today; the signature matches the other requests'.
    pub fn validate(&self) -> Result<(), ProtoError> {
        Ok(())
    }

    pub(crate) fn write(&self, _writer: &mut Writer<'_>) {}

    pub(crate) fn read(body: &[u8]) -> Result<Self, ProtoError> {
        Reader::new(body).finish()?;
        Ok(Self {})
    }
}

/// "Here." Empty, like the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PingResponse {}

impl PingResponse {
    pub(crate) fn write(&self, _writer: &mut Writer<'_>) {}

    pub(crate) fn read(body: &[u8]) -> Result<Self, ProtoError> {
        Reader::new(body).finish()?;
        Ok(Self {})
    }
}
