//! One request frame as the shard's protocol holds it: the whole frame
//! copied into an 8-aligned buffer with its parsed header ([`OwnedFrame`]),
//! and the faults that close a connection ([`FrameError`]: what the error
//! reply echoes of the request's header). Plain data: this file must not
//! answer a request.

use spool_wire::batch::BatchBytes;
use spool_wire::proto::limits::FRAME_HEADER_BYTES;
use spool_wire::proto::{CorrelationId, ErrorResponse, Frame, FrameHeader, ProtoError};

/// A whole request frame, copied into an aligned buffer, with what
/// [`SpoolHandler::decode`] already learned from its header, so `answer`
/// does not parse the header again.
#[derive(Debug)]
pub struct OwnedFrame {
    pub(super) bytes: BatchBytes,
    /// The parsed header, or the error reply for a frame whose api key or
    /// version this broker does not serve (answered, connection kept).
    pub(super) header: Result<FrameHeader, ProtoError>,
}

impl OwnedFrame {
    /// The frame as the codec sees it; valid only with an `Ok` header.
    pub(super) fn frame(&self, header: FrameHeader) -> Frame<'_> {
        let body_end = FRAME_HEADER_BYTES + header.body_bytes as usize;
        Frame { header, body: &self.bytes[FRAME_HEADER_BYTES..body_end] }
    }
}

/// Why the connection must close, and what the error reply echoes: the
/// request's correlation id when the header is whole (`CONNECTION` when the
/// frame's length already disqualifies it), and its raw api key and version
/// when those bytes arrived, so a client's decoder can read the reply.
#[derive(Debug, thiserror::Error)]
#[error("{error}")]
pub struct FrameError {
    pub(super) error: ProtoError,
    pub(super) correlation_id: CorrelationId,
    pub(super) api_key: u16,
    pub(super) api_version: u16,
    /// The answer to send instead of the decode error's (a request refused
    /// before the authentication handshake).
    pub(super) refusal: Option<ErrorResponse>,
}

impl FrameError {
    /// A fault about a whole frame in `bytes`: echoes its id, key, version.
    pub(super) fn of_frame(error: ProtoError, bytes: &[u8]) -> Self {
        let (correlation_id, api_key, api_version) = raw_ids(bytes);
        Self { error, correlation_id, api_key, api_version, refusal: None }
    }

    /// A fault found from the length prefix alone: correlation id 0 (the
    /// protocol's rule for a frame we refuse to read), key and version if
    /// they arrived.
    pub(super) fn of_prefix(error: ProtoError, bytes: &[u8]) -> Self {
        let (_, api_key, api_version) = raw_ids(bytes);
        Self {
            error,
            correlation_id: CorrelationId::CONNECTION,
            api_key,
            api_version,
            refusal: None,
        }
    }
}

/// Correlation id, api key and version read straight from a frame header
/// (used only to address an error reply); zero where the bytes are missing.
pub(super) fn raw_ids(bytes: &[u8]) -> (CorrelationId, u16, u16) {
    let read_u16 =
        |at: usize| bytes.get(at..at + 2).map_or(0, |b| u16::from_le_bytes([b[0], b[1]]));
    let correlation_id = bytes.get(8..16).map_or(CorrelationId::CONNECTION, |b| {
        let mut raw = [0u8; 8];
        raw.copy_from_slice(b);
        CorrelationId(u64::from_le_bytes(raw))
    });
    (correlation_id, read_u16(4), read_u16(6))
}
