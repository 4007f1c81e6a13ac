//! Frames: the fixed little-endian header, frame encoding, and the streaming
//! [`FrameDecoder`] both the glommio server and the tokio client feed from a
//! socket.
//!
//! This module knows how long a frame is and what its header says; it does not
//! know what a body means (see `data` and `control`). Layout (all little
//! endian, `docs/design/protocol.md` has the diagram):
//!
//! ```text
//! 0   u32 frame_bytes     whole frame, this field included; multiple of 8
//! 4   u16 api_key
//! 6   u16 api_version
//! 8   u64 correlation_id
//! 16  u16 flags           bit 0: response; other bits reserved (zero)
//! 18  u16 error_code      0 in requests; a stable ErrorCode in responses
//! 20  u32 body_bytes      body length; frame_bytes - 24 - body_bytes is 0..=7
//! 24  body, then zero padding to the frame length
//! ```
//!
//! Frame lengths are multiples of 8 so that, read into an 8-aligned buffer,
//! every frame starts 8-aligned and the rkyv batches and records inside can be
//! validated and accessed where they lie.

use rkyv::util::AlignedVec;

use super::codec::padding;
use super::error::ProtoError;
use super::limits::{
    DECODER_BUFFER_BYTES_MAX, DECODER_READ_BYTES, FRAME_ALIGN, FRAME_HEADER_BYTES, MAX_FRAME_BYTES,
};
use crate::codes::ErrorCode;

/// Identifies a request on its connection; the response echoes it. Chosen by
/// the client, unique among its in-flight requests on that connection, never 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CorrelationId(pub u64);

impl CorrelationId {
    /// Reserved for errors about the connection rather than one request (an
    /// oversized frame whose id was never read). Requests never use it.
    pub const CONNECTION: CorrelationId = CorrelationId(0);
}

/// Header flag: this frame is a response.
pub const FLAG_RESPONSE: u16 = 1;

/// Every flag bit this version defines.
const FLAGS_KNOWN: u16 = FLAG_RESPONSE;

/// The Claim version that may name [`PartitionId::ANY`] and whose deliveries
/// name their partition.
///
/// [`PartitionId::ANY`]: crate::proto::PartitionId::ANY
pub const CLAIM_VERSION_ANY: u16 = 1;

/// The Claim version that may be answered [`ErrorCode::NotLeader`].
pub const CLAIM_VERSION_NOT_LEADER: u16 = 2;

/// The Claim version that names a subscription (its name after the fixed
/// fields; empty: the queue's default subscription) and may be answered
/// [`ErrorCode::SubscriptionNotFound`].
pub const CLAIM_VERSION_SUBSCRIPTION: u16 = 3;

/// The Enqueue version whose records may be answered
/// [`ErrorCode::KeyMoved`].
pub const ENQUEUE_VERSION_KEY_MOVED: u16 = 2;

/// The Enqueue version whose records may be answered
/// [`ErrorCode::ActiveKeysFull`]; the layouts are unchanged.
pub const ENQUEUE_VERSION_KEYS_FULL: u16 = 3;

/// The version of Peek, Purge, DeadLetters and Redrive whose request names
/// a subscription (empty: the queue's default) and may be answered
/// [`ErrorCode::SubscriptionNotFound`]; an older request acts in the
/// default subscription.
pub const INSPECT_VERSION_SUBSCRIPTION: u16 = 2;

/// The CreateQueue version whose queue config may carry a retention window
/// (`retention_ms`, `retention_bytes`; `docs/design/subscriptions.md` §5).
/// A client sends it only for a queue with a window, so a broker that
/// predates windows answers `UNSUPPORTED_VERSION` instead of creating the
/// queue without one; an older request's window reads as none.
pub const CREATE_QUEUE_VERSION_RETENTION: u16 = 2;

/// The CreateQueue version whose queue config may ask for ordered lanes
/// (`ordered`; `docs/design/ordered-lanes.md`). A client sends it only for
/// an ordered queue, so a broker that predates ordered lanes answers
/// `UNSUPPORTED_VERSION` instead of creating the queue unordered; an older
/// request reads as unordered.
pub const CREATE_QUEUE_VERSION_ORDERED: u16 = 3;

/// The DescribeQueue version whose answer lists the queue's subscriptions
/// with their counters (`DescribeQueueResponse::subscriptions`); an answer
/// to an older version is the layout it always was.
pub const DESCRIBE_QUEUE_VERSION_SUBSCRIPTIONS: u16 = 2;

/// The operation a frame carries. Numbers are stable and never reused, like
/// error codes; data-path keys are below 16, control-plane keys 16 and up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u16)]
#[non_exhaustive]
pub enum ApiKey {
    /// Append one record batch to a partition.
    Enqueue = 1,
    /// Lease up to `credits` messages.
    Claim = 2,
    /// Push a lease's deadline out.
    Extend = 3,
    /// Finish claimed messages.
    Ack = 4,
    /// Give a claimed message back, now or later.
    Release = 5,
    /// Withdraw a long-poll Claim still waiting on the same connection.
    CancelClaim = 6,
    /// The connection handshake: principal and secret (first request when
    /// the broker has authentication on).
    Authenticate = 7,
    /// A connection's proof of life: answered at once, whatever else the
    /// connection waits for (the client's liveness probe).
    Ping = 8,
    /// Open, keep alive or close a consumer session on this connection
    /// (`docs/design/sessions.md`).
    Session = 9,
    /// Create a queue.
    CreateQueue = 16,
    /// Delete a queue.
    DeleteQueue = 17,
    /// List queue names.
    ListQueues = 18,
    /// A queue's configuration and per-partition counts.
    DescribeQueue = 19,
    /// Where each partition lives.
    Metadata = 20,
    /// Read messages without claiming them.
    Peek = 21,
    /// Drop a partition's messages.
    Purge = 22,
    /// List a partition's dead letters.
    DeadLetters = 23,
    /// Move dead letters back to ready.
    Redrive = 24,
    /// Grow a queue to more partitions.
    ResizeQueue = 25,
    /// Add a subscription to a queue.
    CreateSubscription = 26,
    /// Delete a subscription of a queue.
    DeleteSubscription = 27,
}

impl ApiKey {
    /// Every api key, in numeric order.
    pub const ALL: [ApiKey; 21] = [
        ApiKey::Enqueue,
        ApiKey::Claim,
        ApiKey::Extend,
        ApiKey::Ack,
        ApiKey::Release,
        ApiKey::CancelClaim,
        ApiKey::Authenticate,
        ApiKey::Ping,
        ApiKey::Session,
        ApiKey::CreateQueue,
        ApiKey::DeleteQueue,
        ApiKey::ListQueues,
        ApiKey::DescribeQueue,
        ApiKey::Metadata,
        ApiKey::Peek,
        ApiKey::Purge,
        ApiKey::DeadLetters,
        ApiKey::Redrive,
        ApiKey::ResizeQueue,
        ApiKey::CreateSubscription,
        ApiKey::DeleteSubscription,
    ];

    /// The key with this number, if any.
    pub fn from_u16(value: u16) -> Option<Self> {
        Self::ALL.into_iter().find(|key| key.as_u16() == value)
    }

    /// The stable number on the wire.
    pub const fn as_u16(self) -> u16 {
        self as u16
    }

    /// Oldest api version this codec decodes and encodes for this key.
    pub const fn min_version(self) -> u16 {
        0
    }

    /// Newest api version this codec decodes and encodes; encoders write it.
    /// Claim v1: the request may name [`PartitionId::ANY`], and each delivery
    /// of the response names its partition. The version
    /// [`not_leader_version`](Self::not_leader_version) names (Claim v2, v1
    /// of the others it names): the answer may be
    /// [`ErrorCode::NotLeader`]; the layouts are unchanged. Claim v3
    /// ([`CLAIM_VERSION_SUBSCRIPTION`]): the request names a subscription
    /// and may be answered [`ErrorCode::SubscriptionNotFound`]. Enqueue v2
    /// ([`ENQUEUE_VERSION_KEY_MOVED`]): a record may be answered
    /// [`ErrorCode::KeyMoved`]; the layouts are unchanged; v3
    /// ([`ENQUEUE_VERSION_KEYS_FULL`]): [`ErrorCode::ActiveKeysFull`] too.
    /// DescribeQueue v2
    /// ([`DESCRIBE_QUEUE_VERSION_SUBSCRIPTIONS`]): the answer lists the
    /// queue's subscriptions. Peek, Purge, DeadLetters and Redrive v2
    /// ([`INSPECT_VERSION_SUBSCRIPTION`]): the request names a subscription
    /// and may be answered [`ErrorCode::SubscriptionNotFound`]. CreateQueue
    /// v2 ([`CREATE_QUEUE_VERSION_RETENTION`]): the config may carry a
    /// retention window; v3 ([`CREATE_QUEUE_VERSION_ORDERED`]): it may ask
    /// for ordered lanes.
    ///
    /// [`PartitionId::ANY`]: crate::proto::PartitionId::ANY
    pub const fn max_version(self) -> u16 {
        match self {
            Self::Enqueue => ENQUEUE_VERSION_KEYS_FULL,
            Self::CreateQueue => CREATE_QUEUE_VERSION_ORDERED,
            Self::Claim => CLAIM_VERSION_SUBSCRIPTION,
            Self::DescribeQueue => DESCRIBE_QUEUE_VERSION_SUBSCRIPTIONS,
            Self::Peek | Self::Purge | Self::DeadLetters | Self::Redrive => {
                INSPECT_VERSION_SUBSCRIPTION
            }
            _ => match self.not_leader_version() {
                Some(version) => version,
                None => 0,
            },
        }
    }

    /// The first version of this key whose answer (the header's code, or
    /// a per-item code) may be [`ErrorCode::NotLeader`]; `None` for keys
    /// that never answer it (they name no partition and no catalog change).
    pub const fn not_leader_version(self) -> Option<u16> {
        match self {
            Self::Claim => Some(CLAIM_VERSION_NOT_LEADER),
            Self::Enqueue
            | Self::Extend
            | Self::Ack
            | Self::Release
            | Self::CreateQueue
            | Self::DeleteQueue
            | Self::DescribeQueue
            | Self::Peek
            | Self::Purge
            | Self::DeadLetters
            | Self::Redrive => Some(1),
            Self::ResizeQueue | Self::CreateSubscription | Self::DeleteSubscription => Some(0),
            Self::CancelClaim
            | Self::Authenticate
            | Self::Ping
            | Self::Session
            | Self::ListQueues
            | Self::Metadata => None,
        }
    }

    /// `code` as a request of this key at `version` may receive it: a
    /// code added after that version is replaced by the one older clients
    /// know for it ([`ErrorCode::NotLeader`] → [`ErrorCode::NotOwner`]).
    /// The same holds for [`ErrorCode::KeyMoved`] (Enqueue before
    /// [`ENQUEUE_VERSION_KEY_MOVED`]: [`ErrorCode::NotOwner`]), for
    /// [`ErrorCode::ActiveKeysFull`] (Enqueue before
    /// [`ENQUEUE_VERSION_KEYS_FULL`]: [`ErrorCode::QueueFull`]) and for
    /// [`ErrorCode::SubscriptionNotFound`] (anything but a Claim of
    /// [`CLAIM_VERSION_SUBSCRIPTION`] or later, a Peek, Purge, DeadLetters
    /// or Redrive of [`INSPECT_VERSION_SUBSCRIPTION`] or later,
    /// CreateSubscription and DeleteSubscription, which alone name a
    /// subscription: [`ErrorCode::InvalidArgument`]), and for
    /// [`ErrorCode::SessionNotFound`] and [`ErrorCode::SessionFenced`]
    /// (Session alone, a key newer than both codes, may receive them;
    /// anything else: [`ErrorCode::InvalidArgument`]).
    pub const fn answerable(self, version: u16, code: ErrorCode) -> ErrorCode {
        match (code, self.not_leader_version()) {
            (ErrorCode::SubscriptionNotFound, _)
                if (matches!(self, Self::Claim) && version >= CLAIM_VERSION_SUBSCRIPTION)
                    || (matches!(
                        self,
                        Self::Peek | Self::Purge | Self::DeadLetters | Self::Redrive
                    ) && version >= INSPECT_VERSION_SUBSCRIPTION)
                    || matches!(self, Self::CreateSubscription | Self::DeleteSubscription) =>
            {
                ErrorCode::SubscriptionNotFound
            }
            (ErrorCode::SubscriptionNotFound, _) => ErrorCode::InvalidArgument,
            (ErrorCode::SessionNotFound | ErrorCode::SessionFenced, _)
                if matches!(self, Self::Session) =>
            {
                code
            }
            (ErrorCode::SessionNotFound | ErrorCode::SessionFenced, _) => {
                ErrorCode::InvalidArgument
            }
            (ErrorCode::NotLeader, Some(since)) if version >= since => ErrorCode::NotLeader,
            (ErrorCode::NotLeader, _) => ErrorCode::NotOwner,
            (ErrorCode::KeyMoved, _)
                if matches!(self, Self::Enqueue) && version >= ENQUEUE_VERSION_KEY_MOVED =>
            {
                ErrorCode::KeyMoved
            }
            (ErrorCode::KeyMoved, _) => ErrorCode::NotOwner,
            (ErrorCode::ActiveKeysFull, _)
                if matches!(self, Self::Enqueue) && version >= ENQUEUE_VERSION_KEYS_FULL =>
            {
                ErrorCode::ActiveKeysFull
            }
            (ErrorCode::ActiveKeysFull, _) => ErrorCode::QueueFull,
            (code, _) => code,
        }
    }

    /// Whether this codec speaks `version` of this key.
    pub const fn supports(self, version: u16) -> bool {
        version >= self.min_version() && version <= self.max_version()
    }

    /// Data-path keys use the hand-written layout; the rest use flatbuffers.
    pub const fn is_data_path(self) -> bool {
        (self as u16) < 16
    }
}

// `ALL` holds each key once, in numeric order: `from_u16` searches it, and
// the tests that walk every key (`wire/tests/`) rely on it.
const _: () = {
    let mut index = 1;
    while index < ApiKey::ALL.len() {
        assert!(ApiKey::ALL[index - 1].as_u16() < ApiKey::ALL[index].as_u16());
        index += 1;
    }
};

/// A validated frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    /// Whole frame length, header and padding included.
    pub frame_bytes: u32,
    /// The operation.
    pub api_key: ApiKey,
    /// Its version; [`ApiKey::supports`] holds.
    pub api_version: u16,
    /// Echoed by the response.
    pub correlation_id: CorrelationId,
    /// Whether this is a response.
    pub is_response: bool,
    /// [`ErrorCode::None`] in every request; in a response, its outcome.
    pub error_code: ErrorCode,
    /// Body length without padding.
    pub body_bytes: u32,
}

/// One complete frame, borrowed from the decoder's buffer (or any slice).
#[derive(Debug, Clone, Copy)]
pub struct Frame<'a> {
    /// Its header.
    pub header: FrameHeader,
    /// The body, without padding. 8-aligned when the frame was.
    pub body: &'a [u8],
}

/// The header fields the sender chooses; lengths are computed when encoding.
/// The api key is raw so an error response can echo a key we do not know.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeaderFields {
    /// Raw api key.
    pub api_key: u16,
    /// Api version.
    pub api_version: u16,
    /// Correlation id.
    pub correlation_id: CorrelationId,
    /// Response flag.
    pub is_response: bool,
    /// Error code (must be [`ErrorCode::None`] in requests).
    pub error_code: ErrorCode,
}

/// Appends one frame: header, the body `write_body` produces, padding.
///
/// On error nothing is left appended to `out`.
///
/// # Errors
/// Whatever `write_body` returns; [`ProtoError::FrameTooLarge`] if the frame
/// would exceed [`MAX_FRAME_BYTES`].
pub(crate) fn encode_frame(
    out: &mut Vec<u8>,
    fields: &HeaderFields,
    write_body: impl FnOnce(&mut Vec<u8>) -> Result<(), ProtoError>,
) -> Result<(), ProtoError> {
    assert!(fields.is_response || fields.error_code == ErrorCode::None);
    let start = out.len();
    out.resize(start + FRAME_HEADER_BYTES, 0);
    if let Err(error) = write_body(out) {
        out.truncate(start);
        return Err(error);
    }
    let body_bytes = out.len() - start - FRAME_HEADER_BYTES;
    let frame_bytes = FRAME_HEADER_BYTES + body_bytes + padding(body_bytes);
    if frame_bytes > MAX_FRAME_BYTES {
        out.truncate(start);
        return Err(ProtoError::FrameTooLarge {
            len_bytes: frame_bytes as u64,
            max_bytes: MAX_FRAME_BYTES as u64,
        });
    }
    out.resize(start + frame_bytes, 0);
    // Both fit in u32: MAX_FRAME_BYTES does (asserted in limits).
    let header = &mut out[start..start + FRAME_HEADER_BYTES];
    header[0..4].copy_from_slice(&(frame_bytes as u32).to_le_bytes());
    header[API_KEY_AT..API_KEY_AT + 2].copy_from_slice(&fields.api_key.to_le_bytes());
    header[6..8].copy_from_slice(&fields.api_version.to_le_bytes());
    header[8..16].copy_from_slice(&fields.correlation_id.0.to_le_bytes());
    let flags = if fields.is_response { FLAG_RESPONSE } else { 0 };
    header[16..18].copy_from_slice(&flags.to_le_bytes());
    header[18..20].copy_from_slice(&fields.error_code.as_u16().to_le_bytes());
    header[20..24].copy_from_slice(&(body_bytes as u32).to_le_bytes());
    Ok(())
}

/// What the framing layer learned from the first 24 bytes, before the api key
/// and version are checked.
struct RawHeader {
    frame_bytes: u32,
    api_key: u16,
    api_version: u16,
    correlation_id: u64,
    is_response: bool,
    error_code: ErrorCode,
    body_bytes: u32,
}

fn read_u32(bytes: &[u8], at: usize) -> u32 {
    let mut raw = [0u8; 4];
    raw.copy_from_slice(&bytes[at..at + 4]);
    u32::from_le_bytes(raw)
}

/// Where the api key sits in a frame (see the layout above).
const API_KEY_AT: usize = 4;

/// The raw api key of the frame that starts `bytes`, once its first
/// `API_KEY_AT + 2` bytes are there (`None` before): a peek for a reader
/// that must route a frame before it is whole; nothing else is checked.
pub fn peek_api_key(bytes: &[u8]) -> Option<u16> {
    (bytes.len() >= API_KEY_AT + 2).then(|| read_u16(bytes, API_KEY_AT))
}

fn read_u16(bytes: &[u8], at: usize) -> u16 {
    let mut raw = [0u8; 2];
    raw.copy_from_slice(&bytes[at..at + 2]);
    u16::from_le_bytes(raw)
}

fn read_u64(bytes: &[u8], at: usize) -> u64 {
    let mut raw = [0u8; 8];
    raw.copy_from_slice(&bytes[at..at + 8]);
    u64::from_le_bytes(raw)
}

/// Checks the length prefix alone: the first thing looked at, so an oversized
/// frame is refused before any of its body is buffered.
fn check_frame_length(frame_bytes: u32, max_frame_bytes: usize) -> Result<(), ProtoError> {
    if frame_bytes as usize > max_frame_bytes {
        return Err(ProtoError::FrameTooLarge {
            len_bytes: u64::from(frame_bytes),
            max_bytes: max_frame_bytes as u64,
        });
    }
    if (frame_bytes as usize) < FRAME_HEADER_BYTES
        || !(frame_bytes as usize).is_multiple_of(FRAME_ALIGN)
    {
        return Err(ProtoError::BadFrameLength { len_bytes: frame_bytes });
    }
    Ok(())
}

/// Parses and checks the 24 header bytes (`bytes.len() >= 24`).
fn parse_raw_header(bytes: &[u8], max_frame_bytes: usize) -> Result<RawHeader, ProtoError> {
    let frame_bytes = read_u32(bytes, 0);
    check_frame_length(frame_bytes, max_frame_bytes)?;
    let flags = read_u16(bytes, 16);
    if flags & !FLAGS_KNOWN != 0 {
        return Err(ProtoError::ReservedFlags { flags });
    }
    let is_response = flags & FLAG_RESPONSE != 0;
    let raw_code = read_u16(bytes, 18);
    let error_code = ErrorCode::from_u16(raw_code).ok_or(ProtoError::UnknownErrorCode(raw_code))?;
    if !is_response && error_code != ErrorCode::None {
        return Err(ProtoError::NonzeroReserved { field: "error code of a request" });
    }
    let body_bytes = read_u32(bytes, 20);
    let expected = FRAME_HEADER_BYTES as u64 + u64::from(body_bytes);
    let expected_padded = expected + padding(expected as usize) as u64;
    if expected_padded != u64::from(frame_bytes) {
        return Err(ProtoError::BadBodyLength { frame_bytes, body_bytes });
    }
    Ok(RawHeader {
        frame_bytes,
        api_key: read_u16(bytes, API_KEY_AT),
        api_version: read_u16(bytes, 6),
        correlation_id: read_u64(bytes, 8),
        is_response,
        error_code,
        body_bytes,
    })
}

/// Decodes exactly one whole frame from `bytes` (no more, no less). For
/// callers that already hold a frame; streams use [`FrameDecoder`].
///
/// # Errors
/// Any framing error; [`ProtoError::TrailingBytes`] or
/// [`ProtoError::Truncated`] when `bytes` is not exactly one frame.
pub fn decode_frame(bytes: &[u8]) -> Result<Frame<'_>, ProtoError> {
    if bytes.len() < FRAME_HEADER_BYTES {
        return Err(ProtoError::Truncated { needed: FRAME_HEADER_BYTES, available: bytes.len() });
    }
    let raw = parse_raw_header(bytes, MAX_FRAME_BYTES)?;
    let frame_bytes = raw.frame_bytes as usize;
    if bytes.len() < frame_bytes {
        return Err(ProtoError::Truncated { needed: frame_bytes, available: bytes.len() });
    }
    if bytes.len() > frame_bytes {
        return Err(ProtoError::TrailingBytes { extra: bytes.len() - frame_bytes });
    }
    finish_frame(raw, bytes)
}

/// Checks padding, api key and version of a fully buffered frame.
fn finish_frame(raw: RawHeader, frame: &[u8]) -> Result<Frame<'_>, ProtoError> {
    let body_end = FRAME_HEADER_BYTES + raw.body_bytes as usize;
    if frame[body_end..].iter().any(|&byte| byte != 0) {
        return Err(ProtoError::NonzeroReserved { field: "frame padding" });
    }
    let api_key = ApiKey::from_u16(raw.api_key).ok_or(ProtoError::UnknownApi {
        api_key: raw.api_key,
        correlation_id: raw.correlation_id,
    })?;
    if !api_key.supports(raw.api_version) {
        return Err(ProtoError::UnsupportedVersion {
            api_key: raw.api_key,
            version: raw.api_version,
            correlation_id: raw.correlation_id,
        });
    }
    Ok(Frame {
        header: FrameHeader {
            frame_bytes: raw.frame_bytes,
            api_key,
            api_version: raw.api_version,
            correlation_id: CorrelationId(raw.correlation_id),
            is_response: raw.is_response,
            error_code: raw.error_code,
            body_bytes: raw.body_bytes,
        },
        body: &frame[FRAME_HEADER_BYTES..body_end],
    })
}

/// Incremental frame decoder over a byte stream.
///
/// Feed it bytes — copy them in with [`feed`](Self::feed), or read straight
/// into [`read_buf`](Self::read_buf) and [`advance`](Self::advance) — then call
/// [`next_frame`](Self::next_frame) until it returns `Ok(None)` ("need more").
///
/// - The length prefix is checked as soon as its 4 bytes arrive, so an
///   oversized frame is an error before any of its body is buffered.
/// - Errors for which [`ProtoError::closes_connection`] holds poison the
///   decoder: the stream is out of sync and every later call fails with
///   [`ProtoError::DecoderPoisoned`]. Send the error response, then close.
/// - [`ProtoError::UnknownApi`] and [`ProtoError::UnsupportedVersion`] skip the
///   (well-delimited) frame; decoding continues with the next one.
/// - The buffer is 8-aligned and frames are multiples of 8 bytes, so every
///   frame and every aligned field inside it is 8-aligned in memory.
///
/// ```
/// use spool_wire::proto::{FrameDecoder, Request, ClaimRequest, CorrelationId, PartitionId, WorkerId};
/// let request = Request::Claim(ClaimRequest {
///     queue: "jobs", partition: PartitionId(0), worker: WorkerId(7),
///     credits: 8, max_bytes: 1 << 20, lease_ms: 30_000, wait_ms: 0, subscription: "",
/// });
/// let mut bytes = Vec::new();
/// request.encode(CorrelationId(1), &mut bytes).unwrap();
/// let mut decoder = FrameDecoder::new();
/// decoder.feed(&bytes[..10]).unwrap();
/// assert!(decoder.next_frame().unwrap().is_none());
/// decoder.feed(&bytes[10..]).unwrap();
/// let frame = decoder.next_frame().unwrap().unwrap();
/// assert_eq!(Request::decode(&frame).unwrap(), request);
/// ```
pub struct FrameDecoder {
    buffer: AlignedVec<FRAME_ALIGN>,
    /// Start of the first undecoded byte.
    start: usize,
    /// End of the valid bytes.
    end: usize,
    max_frame_bytes: usize,
    poisoned: bool,
}

impl Default for FrameDecoder {
    fn default() -> Self {
        Self::new()
    }
}

impl FrameDecoder {
    /// A decoder accepting frames up to [`MAX_FRAME_BYTES`].
    pub fn new() -> Self {
        Self::with_max_frame_bytes(MAX_FRAME_BYTES)
    }

    /// A decoder with a smaller frame limit (e.g. a client that never expects
    /// large responses). Panics if `max_frame_bytes` is not a multiple of 8 in
    /// `24..=MAX_FRAME_BYTES`: that is a configuration bug.
    pub fn with_max_frame_bytes(max_frame_bytes: usize) -> Self {
        assert!(max_frame_bytes >= FRAME_HEADER_BYTES);
        assert!(max_frame_bytes <= MAX_FRAME_BYTES);
        assert!(max_frame_bytes.is_multiple_of(FRAME_ALIGN));
        Self { buffer: AlignedVec::new(), start: 0, end: 0, max_frame_bytes, poisoned: false }
    }

    /// Bytes received but not yet returned as frames.
    pub fn buffered_bytes(&self) -> usize {
        self.end - self.start
    }

    /// Moves undecoded bytes to the front so the buffer (and the next frame)
    /// starts 8-aligned, keeping memory bounded by one frame plus one read.
    fn compact(&mut self) {
        if self.start == 0 {
            return;
        }
        self.buffer.as_mut_slice().copy_within(self.start..self.end, 0);
        self.end -= self.start;
        self.start = 0;
    }

    /// A writable region for the next socket read (at most
    /// [`DECODER_READ_BYTES`]). Call [`advance`](Self::advance) with the count
    /// read.
    ///
    /// # Errors
    /// [`ProtoError::DecoderFull`] when the caller has buffered
    /// [`DECODER_BUFFER_BYTES_MAX`] without draining frames;
    /// [`ProtoError::DecoderPoisoned`] after a fatal error.
    pub fn read_buf(&mut self) -> Result<&mut [u8], ProtoError> {
        if self.poisoned {
            return Err(ProtoError::DecoderPoisoned);
        }
        self.compact();
        let room = DECODER_BUFFER_BYTES_MAX - self.end;
        if room == 0 {
            return Err(ProtoError::DecoderFull {
                buffered_bytes: self.end,
                offered_bytes: DECODER_READ_BYTES,
            });
        }
        let want = self.end + room.min(DECODER_READ_BYTES);
        if self.buffer.len() < want {
            self.buffer.resize(want, 0);
        }
        Ok(&mut self.buffer.as_mut_slice()[self.end..want])
    }

    /// Marks `read_bytes` bytes of the last [`read_buf`](Self::read_buf) as
    /// received. Panics if more than offered: a caller bug.
    pub fn advance(&mut self, read_bytes: usize) {
        assert!(self.end + read_bytes <= self.buffer.len());
        self.end += read_bytes;
    }

    /// Copies `bytes` into the buffer.
    ///
    /// # Errors
    /// [`ProtoError::DecoderFull`] if that would exceed
    /// [`DECODER_BUFFER_BYTES_MAX`] (nothing is copied);
    /// [`ProtoError::DecoderPoisoned`] after a fatal error.
    pub fn feed(&mut self, bytes: &[u8]) -> Result<(), ProtoError> {
        if self.poisoned {
            return Err(ProtoError::DecoderPoisoned);
        }
        self.compact();
        if self.end + bytes.len() > DECODER_BUFFER_BYTES_MAX {
            return Err(ProtoError::DecoderFull {
                buffered_bytes: self.end,
                offered_bytes: bytes.len(),
            });
        }
        self.buffer.truncate_to(self.end);
        self.buffer.extend_from_slice(bytes);
        self.end += bytes.len();
        Ok(())
    }

    /// The next complete frame, or `Ok(None)` if more bytes are needed.
    ///
    /// # Errors
    /// See the type doc: fatal errors poison the decoder; unknown api keys
    /// and unsupported versions skip the frame and are reported once.
    pub fn next_frame(&mut self) -> Result<Option<Frame<'_>>, ProtoError> {
        if self.poisoned {
            return Err(ProtoError::DecoderPoisoned);
        }
        let available = self.end - self.start;
        if available < 4 {
            return Ok(None);
        }
        let pending = &self.buffer.as_slice()[self.start..self.end];
        let frame_bytes = read_u32(pending, 0);
        if let Err(error) = check_frame_length(frame_bytes, self.max_frame_bytes) {
            self.poisoned = true;
            return Err(error);
        }
        if available < FRAME_HEADER_BYTES {
            return Ok(None);
        }
        let raw = match parse_raw_header(pending, self.max_frame_bytes) {
            Ok(raw) => raw,
            Err(error) => {
                self.poisoned = true;
                return Err(error);
            }
        };
        let frame_bytes = raw.frame_bytes as usize;
        if available < frame_bytes {
            return Ok(None);
        }
        let frame_start = self.start;
        self.start += frame_bytes;
        let frame = &self.buffer.as_slice()[frame_start..frame_start + frame_bytes];
        match finish_frame(raw, frame) {
            Ok(frame) => Ok(Some(frame)),
            Err(error) => {
                if error.closes_connection() {
                    self.poisoned = true;
                }
                Err(error)
            }
        }
    }
}

/// `AlignedVec` has no `truncate`; shrinking its length is `resize` down.
trait TruncateTo {
    fn truncate_to(&mut self, len: usize);
}

impl<const A: usize> TruncateTo for AlignedVec<A> {
    fn truncate_to(&mut self, len: usize) {
        if self.len() > len {
            self.resize(len, 0);
        }
    }
}
