//! The request/response protocol: frames, data-path and control-plane
//! messages, and a streaming frame decoder. Pure: no sockets, no runtime, no
//! clock, so the glommio server and the tokio client share it unchanged.
//!
//! How to use it:
//! - **Read side**: put socket bytes into a [`FrameDecoder`] and take
//!   [`Frame`]s out; [`Request::decode`] / [`Response::decode`] turn a frame
//!   into a typed message. On an error, if [`ProtoError::closes_connection`]
//!   holds, answer with [`ErrorResponse::from_proto_error`] (when the
//!   correlation id is known) and close; otherwise answer and carry on.
//! - **Write side**: [`Request::encode`], [`Response::encode`] and
//!   [`ErrorResponse::encode`] append whole frames to a `Vec<u8>`; several
//!   may be appended before one write.
//!
//! What it does not do: check a batch's crc or records (`crate::batch`),
//! enforce a queue's own ranges, or match responses to requests (the client
//! keeps its correlation table). Layouts and rules:
//! `docs/design/protocol.md`.

mod auth;
mod codec;
mod control;
#[allow(
    clippy::all,
    clippy::pedantic,
    clippy::restriction,
    clippy::undocumented_unsafe_blocks,
    unsafe_op_in_unsafe_fn,
    unused_imports,
    dead_code,
    deprecated,
    non_camel_case_types,
    non_snake_case,
    non_upper_case_globals,
    mismatched_lifetime_syntaxes,
    rust_2018_idioms
)]
#[rustfmt::skip]
#[path = "generated/control_generated.rs"]
mod control_generated;
mod data;
mod error;
mod frame;
mod ids;
pub mod limits;
mod message;
mod ping;
mod session;

pub use auth::{
    validate_principal, AuthenticateRequest, AuthenticateResponse, PRINCIPAL_BYTES_MAX,
    SECRET_BYTES_MAX,
};
pub use codec::{
    validate_queue_name, validate_subscription_name, DEAD_LETTER_SUFFIX, DEFAULT_SUBSCRIPTION,
};
pub use control::{
    Backoff, BackoffKind, CreateQueueRequest, CreateQueueResponse, CreateSubscriptionRequest,
    CreateSubscriptionResponse, DeadLetter, DeadLettersRequest, DeadLettersResponse,
    DeleteQueueRequest, DeleteQueueResponse, DeleteSubscriptionRequest, DeleteSubscriptionResponse,
    DescribeQueueRequest, DescribeQueueResponse, KeyMapStats, LaneStats, ListQueuesRequest,
    ListQueuesResponse, MessageState, MetadataRequest, MetadataResponse, PartitionMetadata,
    PartitionReplication, PartitionStats, PeekRequest, PeekResponse, PeekedMessage, PurgeRequest,
    PurgeResponse, QueueConfig, QueueMetadata, QueueSummary, RedriveRequest, RedriveResponse,
    RedriveTarget, ResizeQueueRequest, ResizeQueueResponse, RetainedStats, SubscriptionStart,
    SubscriptionStats,
};
pub use data::{
    AckRequest, AckResponse, CancelClaimRequest, CancelClaimResponse, CancelOutcome, ClaimRequest,
    ClaimResponse, Delivery, DeliveryToken, EnqueueRequest, EnqueueResponse, ExtendRequest,
    ExtendResponse, RecordOutcome, ReleaseRequest, ReleaseResponse,
};
pub use error::ProtoError;
pub use frame::{
    decode_frame, peek_api_key, ApiKey, CorrelationId, Frame, FrameDecoder, FrameHeader,
    CLAIM_VERSION_ANY, CLAIM_VERSION_NOT_LEADER, CLAIM_VERSION_SUBSCRIPTION,
    CREATE_QUEUE_VERSION_ORDERED, CREATE_QUEUE_VERSION_RETENTION,
    DESCRIBE_QUEUE_VERSION_SUBSCRIPTIONS, ENQUEUE_VERSION_KEYS_FULL, ENQUEUE_VERSION_KEY_MOVED,
    FLAG_RESPONSE, INSPECT_VERSION_SUBSCRIPTION,
};
pub use ids::{AssignmentVersion, Generation, LeaderEpoch, Offset, PartitionId, WorkerId};
pub use limits::{DELIVERY_TOKEN_BYTES, MAX_FRAME_BYTES};
pub use message::{ErrorResponse, NodeAddress, Reply, ReplyFrame, Request, Response};
pub use ping::{PingRequest, PingResponse};
pub use session::{SessionRequest, SessionResponse};
