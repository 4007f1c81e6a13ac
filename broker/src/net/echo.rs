//! A length-prefixed echo protocol: a frame handler with no Spool codec and
//! no partitions, which the connection and shard tests serve (`spoold`
//! serves the Spool protocol from `crate::server`).
//!
//! Frame: `u32` little-endian body length, then the body. The response is the
//! same frame. A zero length or a length above the frame limit is a decode
//! error; the fault response is a frame whose body starts with `error: `.
//! It owns nothing else; it exists so the connection loop and the shard
//! bootstrap can be exercised end to end over real TCP.

use std::future::Future;
use std::rc::Rc;

use thiserror::Error;

use crate::net::connection::{Decoded, FrameHandler, ProtocolFault};

/// Bytes of the length prefix.
pub const ECHO_PREFIX_BYTES: usize = 4;
/// Prefix of the fault response body.
pub const ECHO_ERROR_PREFIX: &[u8] = b"error: ";

/// Why an echo frame is invalid.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum EchoError {
    #[error("empty frame")]
    Empty,
    #[error("frame of {len_bytes} bytes exceeds the limit of {frame_bytes_max}")]
    TooLarge { len_bytes: usize, frame_bytes_max: usize },
}

/// Encodes `body` as one echo frame.
pub fn encode_echo_frame(body: &[u8]) -> Vec<u8> {
    let mut frame = Vec::with_capacity(ECHO_PREFIX_BYTES + body.len());
    let len = u32::try_from(body.len()).unwrap_or(u32::MAX);
    frame.extend_from_slice(&len.to_le_bytes());
    frame.extend_from_slice(body);
    frame
}

/// The echo handler; `frame_bytes_max` bounds prefix + body.
#[derive(Debug, Clone, Copy)]
pub struct EchoHandler {
    pub frame_bytes_max: usize,
}

impl FrameHandler for EchoHandler {
    type Frame = Vec<u8>;
    type Response = Vec<u8>;
    type DecodeError = EchoError;

    fn decode(&self, buffer: &[u8]) -> Result<Decoded<Vec<u8>>, EchoError> {
        let Some(prefix) = buffer.first_chunk::<ECHO_PREFIX_BYTES>() else {
            return Ok(Decoded::Incomplete);
        };
        let body_bytes = u32::from_le_bytes(*prefix) as usize;
        if body_bytes == 0 {
            return Err(EchoError::Empty);
        }
        let len_bytes = ECHO_PREFIX_BYTES + body_bytes;
        if len_bytes > self.frame_bytes_max {
            return Err(EchoError::TooLarge { len_bytes, frame_bytes_max: self.frame_bytes_max });
        }
        if buffer.len() < len_bytes {
            return Ok(Decoded::Incomplete);
        }
        Ok(Decoded::Frame { frame: buffer[..len_bytes].to_vec(), len_bytes })
    }

    fn handle(
        self: Rc<Self>,
        frame: Vec<u8>,
        _connection: Rc<crate::net::connection::Connection>,
    ) -> impl Future<Output = Vec<u8>> {
        std::future::ready(frame)
    }

    fn fault_response(&self, fault: ProtocolFault<'_, EchoError>) -> Option<Vec<u8>> {
        let reason = match fault {
            ProtocolFault::Decode(error) => error.to_string(),
            ProtocolFault::FrameTooLarge { frame_bytes_max } => {
                format!("no frame within {frame_bytes_max} bytes")
            }
            ProtocolFault::FrameTimeout => "frame timeout".to_owned(),
        };
        let mut body = ECHO_ERROR_PREFIX.to_vec();
        body.extend_from_slice(reason.as_bytes());
        Some(encode_echo_frame(&body))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: the decoder waits for whole frames, splits pipelined ones and
    // rejects empty and oversized frames. Method: feed prefixes of a buffer.
    #[test]
    fn decode_splits_frames_and_rejects_bad_lengths() {
        let handler = EchoHandler { frame_bytes_max: 16 };
        let mut bytes = encode_echo_frame(b"abc");
        bytes.extend_from_slice(&encode_echo_frame(b"de"));
        assert_eq!(handler.decode(&bytes[..2]), Ok(Decoded::Incomplete));
        assert_eq!(handler.decode(&bytes[..6]), Ok(Decoded::Incomplete));
        assert_eq!(
            handler.decode(&bytes),
            Ok(Decoded::Frame { frame: encode_echo_frame(b"abc"), len_bytes: 7 })
        );
        assert_eq!(
            handler.decode(&bytes[7..]),
            Ok(Decoded::Frame { frame: encode_echo_frame(b"de"), len_bytes: 6 })
        );
        assert_eq!(handler.decode(&0u32.to_le_bytes()), Err(EchoError::Empty));
        assert_eq!(
            handler.decode(&13u32.to_le_bytes()),
            Err(EchoError::TooLarge { len_bytes: 17, frame_bytes_max: 16 })
        );
    }
}
