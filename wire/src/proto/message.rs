//! Requests and responses as two enums, and the functions that turn them into
//! frames and back. This is the API the broker and the client use; `data` and
//! `control` hold the per-operation layouts.
//!
//! An error response has one body layout for every api key and version
//! (message, optional owner address), so a peer can always read why its
//! request failed, even one whose version we do not speak.

use super::auth::{AuthenticateRequest, AuthenticateResponse};
use super::codec::{check_len, check_range, Reader, Writer};
use super::control::{
    check_subscription_version, CreateQueueRequest, CreateQueueResponse, CreateSubscriptionRequest,
    CreateSubscriptionResponse, DeadLettersRequest, DeadLettersResponse, DeleteQueueRequest,
    DeleteQueueResponse, DeleteSubscriptionRequest, DeleteSubscriptionResponse,
    DescribeQueueRequest, DescribeQueueResponse, ListQueuesRequest, ListQueuesResponse,
    MetadataRequest, MetadataResponse, PeekRequest, PeekResponse, PurgeRequest, PurgeResponse,
    RedriveRequest, RedriveResponse, ResizeQueueRequest, ResizeQueueResponse,
};
use super::data::{
    AckRequest, AckResponse, CancelClaimRequest, CancelClaimResponse, ClaimRequest, ClaimResponse,
    EnqueueRequest, EnqueueResponse, ExtendRequest, ExtendResponse, ReleaseRequest,
    ReleaseResponse,
};
use super::error::ProtoError;
use super::frame::{encode_frame, ApiKey, CorrelationId, Frame, HeaderFields};
use super::limits::{ERROR_MESSAGE_BYTES_MAX, HOST_BYTES_MAX};
use super::ping::{PingRequest, PingResponse};
use super::session::{SessionRequest, SessionResponse};
use crate::codes::ErrorCode;

/// Every request, borrowing from the frame where the layout allows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request<'a> {
    /// See [`EnqueueRequest`].
    Enqueue(EnqueueRequest<'a>),
    /// See [`ClaimRequest`].
    Claim(ClaimRequest<'a>),
    /// See [`ExtendRequest`].
    Extend(ExtendRequest),
    /// See [`AckRequest`].
    Ack(AckRequest),
    /// See [`ReleaseRequest`].
    Release(ReleaseRequest<'a>),
    /// See [`CancelClaimRequest`].
    CancelClaim(CancelClaimRequest),
    /// See [`AuthenticateRequest`].
    Authenticate(AuthenticateRequest<'a>),
    /// See [`PingRequest`].
    Ping(PingRequest),
    /// See [`SessionRequest`].
    Session(SessionRequest<'a>),
    /// See [`CreateQueueRequest`].
    CreateQueue(CreateQueueRequest),
    /// See [`DeleteQueueRequest`].
    DeleteQueue(DeleteQueueRequest),
    /// See [`ListQueuesRequest`].
    ListQueues(ListQueuesRequest),
    /// See [`DescribeQueueRequest`].
    DescribeQueue(DescribeQueueRequest),
    /// See [`MetadataRequest`].
    Metadata(MetadataRequest),
    /// See [`PeekRequest`].
    Peek(PeekRequest),
    /// See [`PurgeRequest`].
    Purge(PurgeRequest),
    /// See [`DeadLettersRequest`].
    DeadLetters(DeadLettersRequest),
    /// See [`RedriveRequest`].
    Redrive(RedriveRequest),
    /// See [`ResizeQueueRequest`].
    ResizeQueue(ResizeQueueRequest),
    /// See [`CreateSubscriptionRequest`].
    CreateSubscription(CreateSubscriptionRequest),
    /// See [`DeleteSubscriptionRequest`].
    DeleteSubscription(DeleteSubscriptionRequest),
}

/// Every successful response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Response<'a> {
    /// See [`EnqueueResponse`].
    Enqueue(EnqueueResponse),
    /// See [`ClaimResponse`].
    Claim(ClaimResponse<'a>),
    /// See [`ExtendResponse`].
    Extend(ExtendResponse),
    /// See [`AckResponse`].
    Ack(AckResponse),
    /// See [`ReleaseResponse`].
    Release(ReleaseResponse),
    /// See [`CancelClaimResponse`].
    CancelClaim(CancelClaimResponse),
    /// See [`AuthenticateResponse`].
    Authenticate(AuthenticateResponse),
    /// See [`PingResponse`].
    Ping(PingResponse),
    /// See [`SessionResponse`].
    Session(SessionResponse),
    /// See [`CreateQueueResponse`].
    CreateQueue(CreateQueueResponse),
    /// See [`DeleteQueueResponse`].
    DeleteQueue(DeleteQueueResponse),
    /// See [`ListQueuesResponse`].
    ListQueues(ListQueuesResponse),
    /// See [`DescribeQueueResponse`].
    DescribeQueue(DescribeQueueResponse),
    /// See [`MetadataResponse`].
    Metadata(MetadataResponse),
    /// See [`PeekResponse`].
    Peek(PeekResponse),
    /// See [`PurgeResponse`].
    Purge(PurgeResponse),
    /// See [`DeadLettersResponse`].
    DeadLetters(DeadLettersResponse),
    /// See [`RedriveResponse`].
    Redrive(RedriveResponse),
    /// See [`ResizeQueueResponse`].
    ResizeQueue(ResizeQueueResponse),
    /// See [`CreateSubscriptionResponse`].
    CreateSubscription(CreateSubscriptionResponse),
    /// See [`DeleteSubscriptionResponse`].
    DeleteSubscription(DeleteSubscriptionResponse),
}

/// A host and port, e.g. the owner named by `NOT_OWNER`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeAddress {
    /// DNS name or IP literal, `1..=HOST_BYTES_MAX` bytes.
    pub host: String,
    /// The shard's port.
    pub port: u16,
}

/// The body of a response whose header carries an error code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ErrorResponse {
    /// Never [`ErrorCode::None`].
    pub code: ErrorCode,
    /// For humans; at most `ERROR_MESSAGE_BYTES_MAX` bytes (longer messages
    /// are cut at a character boundary when encoding).
    pub message: String,
    /// With `NOT_OWNER`: where the partition lives.
    pub owner: Option<NodeAddress>,
}

/// A decoded response frame: success or a typed error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply<'a> {
    /// The operation's response.
    Ok(Response<'a>),
    /// The broker's error for this request.
    Err(ErrorResponse),
}

/// A decoded response frame with its correlation id, which is what a client
/// uses to find the pending request: responses complete out of order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplyFrame<'a> {
    /// Echo of the request's id.
    pub correlation_id: CorrelationId,
    /// Which operation it answers.
    pub api_key: ApiKey,
    /// The outcome.
    pub reply: Reply<'a>,
}

fn expect_request(frame: &Frame<'_>) -> Result<(), ProtoError> {
    if frame.header.is_response {
        return Err(ProtoError::WrongDirection { expected: "request" });
    }
    Ok(())
}

/// The api key of a `Request` or `Response` value: both enums name their
/// variants after the operation, so one list serves both.
macro_rules! api_key_of {
    ($value:expr) => {
        match $value {
            Self::Enqueue(_) => ApiKey::Enqueue,
            Self::Claim(_) => ApiKey::Claim,
            Self::Extend(_) => ApiKey::Extend,
            Self::Ack(_) => ApiKey::Ack,
            Self::Release(_) => ApiKey::Release,
            Self::CancelClaim(_) => ApiKey::CancelClaim,
            Self::Authenticate(_) => ApiKey::Authenticate,
            Self::Ping(_) => ApiKey::Ping,
            Self::Session(_) => ApiKey::Session,
            Self::CreateQueue(_) => ApiKey::CreateQueue,
            Self::DeleteQueue(_) => ApiKey::DeleteQueue,
            Self::ListQueues(_) => ApiKey::ListQueues,
            Self::DescribeQueue(_) => ApiKey::DescribeQueue,
            Self::Metadata(_) => ApiKey::Metadata,
            Self::Peek(_) => ApiKey::Peek,
            Self::Purge(_) => ApiKey::Purge,
            Self::DeadLetters(_) => ApiKey::DeadLetters,
            Self::Redrive(_) => ApiKey::Redrive,
            Self::ResizeQueue(_) => ApiKey::ResizeQueue,
            Self::CreateSubscription(_) => ApiKey::CreateSubscription,
            Self::DeleteSubscription(_) => ApiKey::DeleteSubscription,
        }
    };
}

impl<'a> Request<'a> {
    /// The operation.
    pub fn api_key(&self) -> ApiKey {
        api_key_of!(self)
    }

    /// Checks every field against its limits (what the decoder enforces).
    ///
    /// # Errors
    /// The first field out of bounds.
    pub fn validate(&self) -> Result<(), ProtoError> {
        match self {
            Self::Enqueue(request) => request.validate(),
            Self::Claim(request) => request.validate(),
            Self::Extend(request) => request.validate(),
            Self::Ack(request) => request.validate(),
            Self::Release(request) => request.validate(),
            Self::CancelClaim(request) => request.validate(),
            Self::Authenticate(request) => request.validate(),
            Self::Ping(request) => request.validate(),
            Self::Session(request) => request.validate(),
            Self::CreateQueue(request) => request.validate(),
            Self::DeleteQueue(request) => request.validate(),
            Self::ListQueues(_) => Ok(()),
            Self::DescribeQueue(request) => request.validate(),
            Self::Metadata(request) => request.validate(),
            Self::Peek(request) => request.validate(),
            Self::Purge(request) => request.validate(),
            Self::DeadLetters(request) => request.validate(),
            Self::Redrive(request) => request.validate(),
            Self::ResizeQueue(request) => request.validate(),
            Self::CreateSubscription(request) => request.validate(),
            Self::DeleteSubscription(request) => request.validate(),
        }
    }

    /// Appends this request as one frame (newest version of its api key) to
    /// `out`. Nothing is appended on error.
    ///
    /// # Errors
    /// Correlation id 0 (reserved); a field out of bounds
    /// ([`Request::validate`]); a frame above `MAX_FRAME_BYTES`.
    pub fn encode(
        &self,
        correlation_id: CorrelationId,
        out: &mut Vec<u8>,
    ) -> Result<(), ProtoError> {
        self.encode_version(correlation_id, self.api_key().max_version(), out)
    }

    /// [`Request::encode`] as `version` of its api key (a client speaking
    /// to an older broker; tests of older versions).
    ///
    /// # Errors
    /// As [`Request::encode`]; a version this codec does not speak; a
    /// field the version cannot carry (a Claim of partition `ANY` in v0, or
    /// naming a subscription before v3; a Peek, Purge, DeadLetters or
    /// Redrive naming one before v2; a CreateQueue with a retention window
    /// before v2, or ordered before v3).
    pub fn encode_version(
        &self,
        correlation_id: CorrelationId,
        version: u16,
        out: &mut Vec<u8>,
    ) -> Result<(), ProtoError> {
        if correlation_id == CorrelationId::CONNECTION {
            return Err(ProtoError::Inconsistent("correlation id 0 is reserved"));
        }
        let api_key = self.api_key();
        if !api_key.supports(version) {
            return Err(ProtoError::Inconsistent("api version not spoken by this codec"));
        }
        self.validate()?;
        match self {
            Self::Claim(request) => request.validate_version(version)?,
            Self::CreateQueue(request) => request.validate_version(version)?,
            Self::Peek(request) => check_subscription_version(&request.subscription, version)?,
            Self::Purge(request) => check_subscription_version(&request.subscription, version)?,
            Self::DeadLetters(request) => {
                check_subscription_version(&request.subscription, version)?;
            }
            Self::Redrive(request) => check_subscription_version(&request.subscription, version)?,
            _ => {}
        }
        let fields = HeaderFields {
            api_key: api_key.as_u16(),
            api_version: version,
            correlation_id,
            is_response: false,
            error_code: ErrorCode::None,
        };
        encode_frame(out, &fields, |out| {
            let mut writer = Writer::new(out);
            match self {
                Self::Enqueue(request) => request.write(&mut writer),
                Self::Claim(request) => request.write(&mut writer, version),
                Self::Extend(request) => request.write(&mut writer),
                Self::Ack(request) => request.write(&mut writer),
                Self::Release(request) => request.write(&mut writer),
                Self::CancelClaim(request) => request.write(&mut writer),
                Self::Authenticate(request) => request.write(&mut writer),
                Self::Ping(request) => request.write(&mut writer),
                Self::Session(request) => request.write(&mut writer),
                Self::CreateQueue(request) => request.write(out),
                Self::DeleteQueue(request) => request.write(out),
                Self::ListQueues(request) => request.write(out),
                Self::DescribeQueue(request) => request.write(out),
                Self::Metadata(request) => request.write(out),
                Self::Peek(request) => request.write(out),
                Self::Purge(request) => request.write(out),
                Self::DeadLetters(request) => request.write(out),
                Self::Redrive(request) => request.write(out),
                Self::ResizeQueue(request) => request.write(out),
                Self::CreateSubscription(request) => request.write(out),
                Self::DeleteSubscription(request) => request.write(out),
            }
            Ok(())
        })
    }

    /// Whether [`Request::decode`] would accept `frame`: the same checks and
    /// the same error, without building what does not borrow from the
    /// frame (an Ack's token list), so a caller that must check a frame
    /// before it keeps it, and decodes it later, allocates only once.
    ///
    /// # Errors
    /// As [`Request::decode`].
    pub fn check(frame: &Frame<'a>) -> Result<(), ProtoError> {
        match frame.header.api_key {
            ApiKey::Ack => {
                expect_request(frame)?;
                AckRequest::check(frame.body)
            }
            _ => Self::decode(frame).map(drop),
        }
    }

    /// Decodes and validates a request frame. The frame's header has already
    /// been validated by the frame decoder (api key known, version supported).
    ///
    /// # Errors
    /// A response frame; a malformed body; a field out of bounds.
    pub fn decode(frame: &Frame<'a>) -> Result<Self, ProtoError> {
        expect_request(frame)?;
        let body = frame.body;
        let version = frame.header.api_version;
        // One request layout per key except Claim (v1: partition ANY; v3:
        // the subscription), the inspection keys (v2: the subscription) and
        // CreateQueue (v2: the retention window; v3: ordered).
        Ok(match frame.header.api_key {
            ApiKey::Enqueue => Self::Enqueue(EnqueueRequest::read(body)?),
            ApiKey::Claim => Self::Claim(ClaimRequest::read(body, version)?),
            ApiKey::Extend => Self::Extend(ExtendRequest::read(body)?),
            ApiKey::Ack => Self::Ack(AckRequest::read(body)?),
            ApiKey::Release => Self::Release(ReleaseRequest::read(body)?),
            ApiKey::CancelClaim => Self::CancelClaim(CancelClaimRequest::read(body)?),
            ApiKey::Authenticate => Self::Authenticate(AuthenticateRequest::read(body)?),
            ApiKey::Ping => Self::Ping(PingRequest::read(body)?),
            ApiKey::Session => Self::Session(SessionRequest::read(body)?),
            ApiKey::CreateQueue => Self::CreateQueue(CreateQueueRequest::read(body, version)?),
            ApiKey::DeleteQueue => Self::DeleteQueue(DeleteQueueRequest::read(body)?),
            ApiKey::ListQueues => Self::ListQueues(ListQueuesRequest::read(body)?),
            ApiKey::DescribeQueue => Self::DescribeQueue(DescribeQueueRequest::read(body)?),
            ApiKey::Metadata => Self::Metadata(MetadataRequest::read(body)?),
            ApiKey::Peek => Self::Peek(PeekRequest::read(body, version)?),
            ApiKey::Purge => Self::Purge(PurgeRequest::read(body, version)?),
            ApiKey::DeadLetters => Self::DeadLetters(DeadLettersRequest::read(body, version)?),
            ApiKey::Redrive => Self::Redrive(RedriveRequest::read(body, version)?),
            ApiKey::ResizeQueue => Self::ResizeQueue(ResizeQueueRequest::read(body)?),
            ApiKey::CreateSubscription => {
                Self::CreateSubscription(CreateSubscriptionRequest::read(body)?)
            }
            ApiKey::DeleteSubscription => {
                Self::DeleteSubscription(DeleteSubscriptionRequest::read(body)?)
            }
        })
    }
}

impl<'a> Response<'a> {
    /// The operation it answers.
    pub fn api_key(&self) -> ApiKey {
        api_key_of!(self)
    }

    /// Checks every field against its limits (what the decoder enforces).
    ///
    /// # Errors
    /// The first field out of bounds.
    pub fn validate(&self) -> Result<(), ProtoError> {
        match self {
            Self::Enqueue(response) => response.validate(),
            Self::Claim(response) => response.validate(),
            Self::Ack(response) => response.validate(),
            Self::ListQueues(response) => response.validate(),
            Self::DescribeQueue(response) => response.validate(),
            Self::Metadata(response) => response.validate(),
            Self::Peek(response) => response.validate(),
            Self::DeadLetters(response) => response.validate(),
            Self::Extend(_)
            | Self::Release(_)
            | Self::CancelClaim(_)
            | Self::Authenticate(_)
            | Self::Ping(_)
            | Self::Session(_)
            | Self::CreateQueue(_)
            | Self::DeleteQueue(_)
            | Self::Purge(_)
            | Self::Redrive(_)
            | Self::ResizeQueue(_)
            | Self::CreateSubscription(_)
            | Self::DeleteSubscription(_) => Ok(()),
        }
    }

    /// Bytes the data path's responses take as a frame, padding included
    /// (exact for enqueue, claim, ack and ping, an upper bound for the others);
    /// 0 for the control plane's, whose buffer grows as written.
    pub fn encoded_len_hint(&self) -> usize {
        self.encoded_len_hint_version(self.api_key().max_version())
    }

    /// [`Response::encoded_len_hint`] as `version` of its api key.
    pub fn encoded_len_hint_version(&self, version: u16) -> usize {
        use crate::proto::limits::FRAME_HEADER_BYTES;
        let body = match self {
            Self::Enqueue(response) => 16 + 16 * response.records.len(),
            Self::Ack(response) => 4 + 2 * response.results.len(),
            Self::Claim(response) => response.body_bytes(version),
            Self::Extend(_) | Self::Release(_) | Self::CancelClaim(_) => 16,
            Self::Ping(_) => 0,
            Self::Session(_) => 24,
            _ => return 0,
        };
        FRAME_HEADER_BYTES + body.next_multiple_of(8)
    }

    /// Appends this response as one frame answering `correlation_id` (newest
    /// version of its api key; a broker answering an older request version
    /// will pick the version here once a second one exists).
    ///
    /// # Errors
    /// A field out of bounds, or a frame above `MAX_FRAME_BYTES`.
    pub fn encode(
        &self,
        correlation_id: CorrelationId,
        out: &mut Vec<u8>,
    ) -> Result<(), ProtoError> {
        self.encode_version(correlation_id, self.api_key().max_version(), out)
    }

    /// [`Response::encode`] as `version` of its api key: the version of the
    /// request it answers.
    ///
    /// # Errors
    /// As [`Response::encode`]; a version this codec does not speak.
    pub fn encode_version(
        &self,
        correlation_id: CorrelationId,
        version: u16,
        out: &mut Vec<u8>,
    ) -> Result<(), ProtoError> {
        let api_key = self.api_key();
        if !api_key.supports(version) {
            return Err(ProtoError::Inconsistent("api version not spoken by this codec"));
        }
        self.validate()?;
        // One allocation for the data path's answers instead of a header
        // buffer grown by doubling as the body is written.
        out.reserve(self.encoded_len_hint_version(version));
        let fields = HeaderFields {
            api_key: api_key.as_u16(),
            api_version: version,
            correlation_id,
            is_response: true,
            error_code: ErrorCode::None,
        };
        encode_frame(out, &fields, |out| {
            let mut writer = Writer::new(out);
            match self {
                Self::Enqueue(response) => response.write(&mut writer, version),
                Self::Claim(response) => response.write(&mut writer, version),
                Self::Extend(response) => response.write(&mut writer),
                Self::Ack(response) => response.write(&mut writer, version),
                Self::Release(response) => response.write(&mut writer),
                Self::CancelClaim(response) => response.write(&mut writer),
                Self::Authenticate(response) => response.write(&mut writer),
                Self::Ping(response) => response.write(&mut writer),
                Self::Session(response) => response.write(&mut writer),
                Self::CreateQueue(response) => response.write(out),
                Self::DeleteQueue(response) => response.write(out),
                Self::ListQueues(response) => response.write(out),
                Self::DescribeQueue(response) => response.write(out, version),
                Self::Metadata(response) => response.write(out),
                Self::Peek(response) => response.write(out),
                Self::Purge(response) => response.write(out),
                Self::DeadLetters(response) => response.write(out),
                Self::Redrive(response) => response.write(out),
                Self::ResizeQueue(response) => response.write(out),
                Self::CreateSubscription(response) => response.write(out),
                Self::DeleteSubscription(response) => response.write(out),
            }
            Ok(())
        })
    }

    /// Decodes a response frame: the operation's response, or the error the
    /// header names.
    ///
    /// # Errors
    /// A request frame; a malformed body; a field out of bounds.
    pub fn decode(frame: &Frame<'a>) -> Result<ReplyFrame<'a>, ProtoError> {
        if !frame.header.is_response {
            return Err(ProtoError::WrongDirection { expected: "response" });
        }
        let body = frame.body;
        let version = frame.header.api_version;
        let reply = if frame.header.error_code == ErrorCode::None {
            Reply::Ok(match frame.header.api_key {
                ApiKey::Enqueue => Self::Enqueue(EnqueueResponse::read(body)?),
                ApiKey::Claim => Self::Claim(ClaimResponse::read(body, version)?),
                ApiKey::Extend => Self::Extend(ExtendResponse::read(body)?),
                ApiKey::Ack => Self::Ack(AckResponse::read(body)?),
                ApiKey::Release => Self::Release(ReleaseResponse::read(body)?),
                ApiKey::CancelClaim => Self::CancelClaim(CancelClaimResponse::read(body)?),
                ApiKey::Authenticate => Self::Authenticate(AuthenticateResponse::read(body)?),
                ApiKey::Ping => Self::Ping(PingResponse::read(body)?),
                ApiKey::Session => Self::Session(SessionResponse::read(body)?),
                ApiKey::CreateQueue => Self::CreateQueue(CreateQueueResponse::read(body)?),
                ApiKey::DeleteQueue => Self::DeleteQueue(DeleteQueueResponse::read(body)?),
                ApiKey::ListQueues => Self::ListQueues(ListQueuesResponse::read(body)?),
                ApiKey::DescribeQueue => {
                    Self::DescribeQueue(DescribeQueueResponse::read(body, version)?)
                }
                ApiKey::Metadata => Self::Metadata(MetadataResponse::read(body)?),
                ApiKey::Peek => Self::Peek(PeekResponse::read(body)?),
                ApiKey::Purge => Self::Purge(PurgeResponse::read(body)?),
                ApiKey::DeadLetters => Self::DeadLetters(DeadLettersResponse::read(body)?),
                ApiKey::Redrive => Self::Redrive(RedriveResponse::read(body)?),
                ApiKey::ResizeQueue => Self::ResizeQueue(ResizeQueueResponse::read(body)?),
                ApiKey::CreateSubscription => {
                    Self::CreateSubscription(CreateSubscriptionResponse::read(body)?)
                }
                ApiKey::DeleteSubscription => {
                    Self::DeleteSubscription(DeleteSubscriptionResponse::read(body)?)
                }
            })
        } else {
            Reply::Err(ErrorResponse::read(frame.header.error_code, body)?)
        };
        Ok(ReplyFrame {
            correlation_id: frame.header.correlation_id,
            api_key: frame.header.api_key,
            reply,
        })
    }
}

/// Cuts `message` to at most `max` bytes at a character boundary.
fn truncate_message(message: &str, max: usize) -> &str {
    if message.len() <= max {
        return message;
    }
    let mut end = max;
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    &message[..end]
}

impl ErrorResponse {
    /// An error response with no owner.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self { code, message: message.into(), owner: None }
    }

    /// The error response for a decode failure.
    pub fn from_proto_error(error: &ProtoError) -> Self {
        Self::new(error.code(), error.to_string())
    }

    /// Appends an error response frame. `api_key` and `api_version` are raw
    /// echoes of the request's header, so a request with an unknown key or
    /// version can still be answered.
    ///
    /// # Errors
    /// [`ProtoError::Inconsistent`] for [`ErrorCode::None`];
    /// [`ProtoError::OutOfRange`] for an empty or too long owner host.
    pub fn encode(
        &self,
        correlation_id: CorrelationId,
        api_key: u16,
        api_version: u16,
        out: &mut Vec<u8>,
    ) -> Result<(), ProtoError> {
        if self.code == ErrorCode::None {
            return Err(ProtoError::Inconsistent("an error response needs an error code"));
        }
        if let Some(owner) = &self.owner {
            check_range("owner host length", owner.host.len() as u64, 1, HOST_BYTES_MAX as u64)?;
        }
        // A code the request's version predates goes out as the one that
        // version knows (`ApiKey::answerable`).
        let code = ApiKey::from_u16(api_key)
            .map_or(self.code, |key| key.answerable(api_version, self.code));
        let fields = HeaderFields {
            api_key,
            api_version,
            correlation_id,
            is_response: true,
            error_code: code,
        };
        encode_frame(out, &fields, |out| {
            let mut writer = Writer::new(out);
            writer.str(truncate_message(&self.message, ERROR_MESSAGE_BYTES_MAX));
            match &self.owner {
                None => writer.u8(0),
                Some(owner) => {
                    writer.u8(1);
                    writer.str(&owner.host);
                    writer.u16(owner.port);
                }
            }
            Ok(())
        })
    }

    fn read(code: ErrorCode, body: &[u8]) -> Result<Self, ProtoError> {
        let mut reader = Reader::new(body);
        let message = reader.str("error message", ERROR_MESSAGE_BYTES_MAX)?.to_owned();
        let owner = match reader.u8()? {
            0 => None,
            1 => {
                let host = reader.str("owner host", HOST_BYTES_MAX)?.to_owned();
                check_len("owner host", host.len(), HOST_BYTES_MAX)?;
                check_range("owner host length", host.len() as u64, 1, HOST_BYTES_MAX as u64)?;
                Some(NodeAddress { host, port: reader.u16()? })
            }
            other => {
                return Err(ProtoError::UnknownEnumValue {
                    field: "owner present",
                    value: other.into(),
                })
            }
        };
        reader.finish()?;
        Ok(Self { code, message, owner })
    }
}
