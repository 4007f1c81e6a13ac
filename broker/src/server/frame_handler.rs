//! [`SpoolHandler`]'s side of the connection loop's contract
//! (`net::FrameHandler`): decode a frame off the read buffer, the intake
//! peek for the consumer pace, admission before the handshake, handing a
//! frame to `handler.rs`, and the replies to refusals and protocol faults.
//! What a request does is `handler.rs`'s; this file must not touch a
//! partition.

use std::rc::Rc;

use spool_wire::batch::BatchBytes;
use spool_wire::proto::{
    decode_frame, CorrelationId, ErrorResponse, ProtoError, Request, MAX_FRAME_BYTES,
};
use spool_wire::ErrorCode;

use super::frame::{raw_ids, FrameError, OwnedFrame};
use super::handler::{error, SpoolHandler};
use crate::net::connection::{Connection, Decoded, FrameHandler, ProtocolFault, Refusal};

impl FrameHandler for SpoolHandler {
    type Frame = OwnedFrame;
    type Response = Vec<u8>;
    type DecodeError = FrameError;

    fn frame_len(&self, buffer: &[u8]) -> Option<usize> {
        let prefix: [u8; 4] = buffer.get(..4)?.try_into().ok()?;
        usize::try_from(u32::from_le_bytes(prefix)).ok()
    }

    fn decode(&self, buffer: &[u8]) -> Result<Decoded<OwnedFrame>, FrameError> {
        if buffer.len() < 4 {
            return Ok(Decoded::Incomplete);
        }
        let declared = u32::from_le_bytes([buffer[0], buffer[1], buffer[2], buffer[3]]) as usize;
        let limit = MAX_FRAME_BYTES.min(self.state.config.frame_bytes_max as usize);
        if declared > limit {
            let error =
                ProtoError::FrameTooLarge { len_bytes: declared as u64, max_bytes: limit as u64 };
            return Err(FrameError::of_prefix(error, buffer));
        }
        if declared < spool_wire::proto::limits::FRAME_HEADER_BYTES {
            let error = ProtoError::BadFrameLength { len_bytes: declared as u32 };
            return Err(FrameError::of_prefix(error, buffer));
        }
        if buffer.len() < declared {
            return Ok(Decoded::Incomplete);
        }
        let mut bytes = BatchBytes::with_capacity(declared);
        bytes.extend_from_slice(&buffer[..declared]);
        let header = match decode_frame(&bytes) {
            Ok(frame) if frame.header.is_response => {
                let error = ProtoError::WrongDirection { expected: "request" };
                return Err(FrameError::of_frame(error, &bytes));
            }
            Ok(frame) => match Request::check(&frame) {
                // A body that does not parse (truncated, trailing bytes, bad
                // flatbuffer) closes the connection (protocol.md, "Errors and
                // the connection"); a field out of range is answered by
                // `answer` and the connection carries on. Here the body is
                // only checked (`Request::check` builds nothing, not even an
                // Ack's token list); `answer` decodes it once (the request
                // borrows from the frame, which moves into its task). The
                // header is kept, not parsed again.
                Err(failure) if failure.closes_connection() => {
                    return Err(FrameError::of_frame(failure, &bytes));
                }
                _ => Ok(frame.header),
            },
            Err(failure @ ProtoError::UnknownApi { .. })
            | Err(failure @ ProtoError::UnsupportedVersion { .. }) => Err(failure),
            Err(failure) => return Err(FrameError::of_frame(failure, &bytes)),
        };
        Ok(Decoded::Frame { frame: OwnedFrame { bytes, header }, len_bytes: declared })
    }

    fn is_intake(&self, buffer: &[u8]) -> bool {
        spool_wire::proto::peek_api_key(buffer) == Some(spool_wire::proto::ApiKey::Enqueue.as_u16())
    }

    fn admit(&self, frame: &OwnedFrame, connection: &Connection) -> Result<(), FrameError> {
        let api_key = frame.header.as_ref().ok().map(|header| header.api_key);
        self.auth.admit(api_key, connection).map_err(|refusal| {
            let (correlation_id, api_key, api_version) = raw_ids(&frame.bytes);
            FrameError {
                error: ProtoError::Inconsistent("request before the authentication handshake"),
                correlation_id,
                api_key,
                api_version,
                refusal: Some(refusal),
            }
        })
    }

    async fn handle(self: Rc<Self>, frame: OwnedFrame, connection: Rc<Connection>) -> Vec<u8> {
        self.answer(&frame, &connection).await
    }

    fn certificate_principal(
        &self,
        principal: &str,
        connection: &Connection,
    ) -> Result<(), Option<Vec<u8>>> {
        // Answered as the handshake it stands for (a connection-level
        // error: correlation id 0), so a client reads it as the close's reason.
        self.auth.accept_certificate(principal, connection).map_err(|refusal| {
            let api_key = spool_wire::proto::ApiKey::Authenticate as u16;
            Some(Self::encode_error(&refusal, CorrelationId::CONNECTION, api_key, 0))
        })
    }

    fn refusal_response(&self, refusal: Refusal) -> Option<Vec<u8>> {
        let Refusal::TooManyConnections { connections_max } = refusal;
        let message = format!(
            "this shard serves at most {connections_max} connections \
             (connections_per_shard_max); retry later or use fewer connections"
        );
        let reply = error(ErrorCode::TooManyConnections, message);
        Some(Self::encode_error(&reply, CorrelationId::CONNECTION, 0, 0))
    }

    fn fault_response(&self, fault: ProtocolFault<'_, FrameError>) -> Option<Vec<u8>> {
        let (reply, correlation_id, api_key, api_version) = match fault {
            ProtocolFault::Decode(failure) => (
                failure
                    .refusal
                    .clone()
                    .unwrap_or_else(|| ErrorResponse::from_proto_error(&failure.error)),
                failure.correlation_id,
                failure.api_key,
                failure.api_version,
            ),
            ProtocolFault::FrameTooLarge { frame_bytes_max } => {
                let message = format!("no whole frame within {frame_bytes_max} bytes");
                (error(ErrorCode::FrameTooLarge, message), CorrelationId::CONNECTION, 0, 0)
            }
            ProtocolFault::FrameTimeout => {
                let message = "frame did not complete within the frame timeout";
                (error(ErrorCode::Timeout, message), CorrelationId::CONNECTION, 0, 0)
            }
        };
        Some(Self::encode_error(&reply, correlation_id, api_key, api_version))
    }
}
