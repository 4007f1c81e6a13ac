//! Errors of the frame and message codecs: what is wrong with some bytes a peer
//! sent. Each maps onto one stable [`ErrorCode`] for the error response, and
//! says whether the connection must be closed after that response.

use thiserror::Error;

use crate::codes::ErrorCode;

/// Everything the protocol codec can find wrong with its input.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ProtoError {
    /// The frame's declared length is above the limit; nothing of its body was
    /// (or will be) buffered.
    #[error("frame of {len_bytes} bytes exceeds the limit of {max_bytes}")]
    FrameTooLarge { len_bytes: u64, max_bytes: u64 },
    /// The declared length cannot hold the header, or is not a multiple of 8.
    #[error("bad frame length {len_bytes}")]
    BadFrameLength { len_bytes: u32 },
    /// The header's body length disagrees with the frame length and padding.
    #[error("body length {body_bytes} does not fit frame length {frame_bytes}")]
    BadBodyLength { frame_bytes: u32, body_bytes: u32 },
    /// A flag bit this version does not define is set.
    #[error("reserved flag bits set: {flags:#06x}")]
    ReservedFlags { flags: u16 },
    /// A request carried an error code, or padding/reserved bytes were not zero.
    #[error("nonzero reserved field or padding: {field}")]
    NonzeroReserved { field: &'static str },
    /// The header names an api key no operation has. The frame was skipped and
    /// the stream is still in sync.
    #[error("unknown api key {api_key} (correlation id {correlation_id})")]
    UnknownApi { api_key: u16, correlation_id: u64 },
    /// The api version is not one this codec speaks. The frame was skipped and
    /// the stream is still in sync.
    #[error("api key {api_key} version {version} unsupported (correlation id {correlation_id})")]
    UnsupportedVersion { api_key: u16, version: u16, correlation_id: u64 },
    /// A response's header names an error code no table row has.
    #[error("unknown error code {0}")]
    UnknownErrorCode(u16),
    /// A frame was a response where a request was expected, or the reverse.
    #[error("expected a {expected} frame")]
    WrongDirection { expected: &'static str },
    /// A field runs past the end of the body.
    #[error("truncated body: needed {needed} bytes, {available} available")]
    Truncated { needed: usize, available: usize },
    /// The body has bytes after its last field.
    #[error("{extra} trailing bytes after the body")]
    TrailingBytes { extra: usize },
    /// A string field is not UTF-8.
    #[error("{field} is not UTF-8")]
    NotUtf8 { field: &'static str },
    /// A queue name is empty, too long, or has a character outside
    /// `[A-Za-z0-9._-]`.
    #[error("invalid queue name: {reason}")]
    InvalidQueueName { reason: &'static str },
    /// A subscription name is empty, too long, or has a character outside
    /// `[A-Za-z0-9._-]` (the queue names' rule).
    #[error("invalid subscription name: {reason}")]
    InvalidSubscriptionName { reason: &'static str },
    /// A number is outside its allowed range.
    #[error("{field} = {value} outside {min}..={max}")]
    OutOfRange { field: &'static str, value: u64, min: u64, max: u64 },
    /// A string or list is longer than its limit.
    #[error("{field} has {len} elements/bytes, limit {max}")]
    TooLong { field: &'static str, len: usize, max: usize },
    /// Two fields contradict each other.
    #[error("inconsistent fields: {0}")]
    Inconsistent(&'static str),
    /// An enum field has a value the schema does not define.
    #[error("{field} has undefined value {value}")]
    UnknownEnumValue { field: &'static str, value: u64 },
    /// A required control-plane field is absent.
    #[error("missing required field {0}")]
    MissingField(&'static str),
    /// A control-plane body failed the flatbuffers verifier.
    #[error("invalid flatbuffer: {0}")]
    InvalidFlatbuffer(String),
    /// The batch in an Enqueue is shorter than a batch header or above the limit.
    #[error("batch of {len_bytes} bytes outside {min_bytes}..={max_bytes}")]
    BatchSize { len_bytes: usize, min_bytes: usize, max_bytes: usize },
    /// A record in a Claim response is above the record limit.
    #[error("record of {len_bytes} bytes exceeds {max_bytes}")]
    RecordTooLarge { len_bytes: usize, max_bytes: usize },
    /// The decoder refuses input past its buffer limit (the caller fed more
    /// without draining frames).
    #[error("decoder buffer full: {buffered_bytes} buffered, {offered_bytes} offered")]
    DecoderFull { buffered_bytes: usize, offered_bytes: usize },
    /// The decoder hit a fatal error earlier; the stream is out of sync.
    #[error("decoder stopped after a fatal error")]
    DecoderPoisoned,
}

impl ProtoError {
    /// The stable code an error response to this input carries.
    pub fn code(&self) -> ErrorCode {
        match self {
            Self::FrameTooLarge { .. } => ErrorCode::FrameTooLarge,
            Self::UnknownApi { .. } => ErrorCode::UnknownApi,
            Self::UnsupportedVersion { .. } => ErrorCode::UnsupportedVersion,
            Self::InvalidQueueName { .. }
            | Self::InvalidSubscriptionName { .. }
            | Self::OutOfRange { .. }
            | Self::TooLong { .. }
            | Self::Inconsistent(_)
            | Self::NotUtf8 { .. } => ErrorCode::InvalidArgument,
            Self::BatchSize { .. } => ErrorCode::BatchInvalid,
            Self::RecordTooLarge { .. } => ErrorCode::RecordTooLarge,
            Self::BadFrameLength { .. }
            | Self::BadBodyLength { .. }
            | Self::ReservedFlags { .. }
            | Self::NonzeroReserved { .. }
            | Self::UnknownErrorCode(_)
            | Self::WrongDirection { .. }
            | Self::Truncated { .. }
            | Self::TrailingBytes { .. }
            | Self::UnknownEnumValue { .. }
            | Self::MissingField(_)
            | Self::InvalidFlatbuffer(_)
            | Self::DecoderFull { .. }
            | Self::DecoderPoisoned => ErrorCode::MalformedFrame,
        }
    }

    /// Whether the connection must be closed after the error response.
    ///
    /// Framing errors leave the byte stream out of sync (or, for an oversized
    /// frame, would make us read what we refuse to buffer), and a malformed
    /// body means the peer speaks something else: close. A well-formed frame
    /// with an unknown api, an unsupported version or an out-of-range argument
    /// is answered and the connection continues.
    pub fn closes_connection(&self) -> bool {
        matches!(self.code(), ErrorCode::MalformedFrame | ErrorCode::FrameTooLarge)
    }
}
