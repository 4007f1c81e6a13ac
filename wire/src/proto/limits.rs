//! Named limits of the request/response protocol. Every length, count and
//! range a peer chooses is bounded by one of these and checked on decode,
//! before any work is done. Queue-specific ranges (a queue's own lease range,
//! its partition count) are the broker's to check; these are the absolute
//! sanity bounds no queue may exceed.

use crate::limits::{BATCH_BYTES_MAX, BATCH_HEADER_BYTES, RECORD_BYTES_MAX};

/// Size of the fixed frame header (requests and responses alike).
pub const FRAME_HEADER_BYTES: usize = 24;

/// Every frame's total length is a multiple of this, so that frames laid end
/// to end in an 8-aligned buffer all start 8-aligned, and the rkyv bytes inside
/// them (batches, records) can be accessed in place.
pub const FRAME_ALIGN: usize = 8;

/// Largest frame (header included) either side accepts by default. Sized for
/// the largest Enqueue (a full batch) and the largest Claim response.
pub const MAX_FRAME_BYTES: usize = BATCH_BYTES_MAX + (1 << 20);

/// Longest queue name, in bytes. Names are `[A-Za-z0-9._-]`, non-empty.
pub const QUEUE_NAME_BYTES_MAX: usize = 128;

/// Longest subscription name (Claim v3), in bytes. Names follow the queue
/// names' rule: `[A-Za-z0-9._-]`, non-empty (an empty name on the wire
/// means the queue's default subscription).
pub const SUBSCRIPTION_NAME_BYTES_MAX: usize = QUEUE_NAME_BYTES_MAX;

/// Most subscriptions a queue may have, the default included
/// (`docs/design/subscriptions.md` §2): what DescribeQueue v2 lists at
/// most. The broker's table bound is this one.
pub const SUBSCRIPTIONS_PER_QUEUE_MAX: usize = 16;

/// Longest release reason, in bytes of UTF-8.
pub const RELEASE_REASON_BYTES_MAX: usize = 512;

/// Longest human-readable message in an error response.
pub const ERROR_MESSAGE_BYTES_MAX: usize = 1024;

/// Longest host string (DNS name or IP literal) in metadata and `NOT_OWNER`.
pub const HOST_BYTES_MAX: usize = 255;

/// Most messages one claim may ask for.
pub const CLAIM_CREDITS_MAX: u32 = 1024;

/// Most record bytes one claim may ask for.
pub const CLAIM_BYTES_MAX: u32 = BATCH_BYTES_MAX as u32;

/// Shortest lease any request may name.
pub const LEASE_MS_MIN: u32 = 1;

/// Longest lease any request may name (24 h).
pub const LEASE_MS_MAX: u32 = 24 * 60 * 60 * 1000;

/// Longest total lease lifetime a queue may allow (24 h): a claim extended
/// again and again still ends within a day of its claim.
pub const LEASE_LIFETIME_MS_MAX: u64 = 24 * 60 * 60 * 1000;

/// Longest long-poll wait of a claim.
pub const CLAIM_WAIT_MS_MAX: u32 = 60 * 1000;

/// Longest release delay a Release may name (7 days).
pub const RELEASE_DELAY_MS_MAX: u32 = 7 * 24 * 60 * 60 * 1000;

/// Longest backoff cap a queue may configure (24 h): a message released
/// with the queue's backoff is back within a day.
pub const BACKOFF_CAP_MS_MAX: u32 = 24 * 60 * 60 * 1000;

/// Most tokens in one Ack.
pub const ACK_TOKENS_MAX: u32 = 1024;

/// Size of a delivery token. Its inner layout (ids, epoch, generation, MAC)
/// belongs to the broker; on the wire it is opaque.
pub const DELIVERY_TOKEN_BYTES: usize = 64;

/// Most partitions a queue may have (OMB's largest single-topic workload
/// has 10,000). A Metadata response for such a queue is well under
/// `MAX_FRAME_BYTES`.
pub const PARTITIONS_MAX: u32 = 10_000;

/// Most deliveries before quarantine a queue may configure.
pub const MAX_DELIVERIES_MAX: u32 = 10_000;

/// Longest dedupe window (7 days).
pub const DEDUPE_WINDOW_MS_MAX: u64 = 7 * 24 * 60 * 60 * 1000;

/// Longest retention window by time a queue may configure (30 days): a
/// record stays replayable at most this long after its enqueue
/// (`docs/design/subscriptions.md` §5). 0 means no window.
pub const RETENTION_MS_MAX: u64 = 30 * 24 * 60 * 60 * 1000;

/// Shortest retention window by time (1 s): shorter ones would drop
/// records still waiting for their group commit's sync.
pub const RETENTION_MS_MIN: u64 = 1000;

/// Smallest retention window by size (1 MiB): a smaller one would drop
/// records still waiting for their group commit's sync. The largest is
/// the queue's `max_bytes`.
pub const RETENTION_BYTES_MIN: u64 = 1 << 20;

/// Most queues in one ListQueues or Metadata response, or named in a Metadata
/// request.
pub const QUEUES_LISTED_MAX: usize = 10_000;

/// Most messages one Peek or DeadLetters request may ask for.
pub const INSPECT_MESSAGES_MAX: u32 = 1000;

/// Most offsets in one Redrive request.
pub const REDRIVE_OFFSETS_MAX: usize = 10_000;

/// Longest member id of a consumer session (`docs/design/sessions.md`):
/// the name a consumer rejoins under, UTF-8, at least one byte.
pub const SESSION_MEMBER_BYTES_MAX: usize = 128;

/// Shortest session timeout a Session open may ask for: below it a
/// heartbeat lost to one scheduling hiccup would end the session.
pub const SESSION_TIMEOUT_MS_MIN: u32 = 500;

/// Longest session timeout a Session open may ask for (10 min): past it a
/// session is no quicker than a lease.
pub const SESSION_TIMEOUT_MS_MAX: u32 = 10 * 60 * 1000;

/// Flatbuffers verifier bounds for control-plane bodies: our schemas nest at
/// most 4 tables deep, and no legitimate message has more tables than this.
pub const FLATBUFFER_DEPTH_MAX: usize = 8;

/// See [`FLATBUFFER_DEPTH_MAX`].
pub const FLATBUFFER_TABLES_MAX: usize = 64 * 1024;

/// Largest buffered-but-undecoded input a [`FrameDecoder`](super::FrameDecoder)
/// holds: one frame plus one read's worth of the next.
pub const DECODER_BUFFER_BYTES_MAX: usize = MAX_FRAME_BYTES + DECODER_READ_BYTES;

/// How many bytes [`FrameDecoder::read_buf`](super::FrameDecoder::read_buf)
/// offers for one read.
pub const DECODER_READ_BYTES: usize = 64 * 1024;

/// Fixed bytes of one delivery in a Claim response before its record, in
/// the newest version (v1 adds the delivery's partition and 4 reserved
/// bytes to v0's token, offset, attempt, length and generation).
pub const CLAIM_DELIVERY_HEADER_BYTES: usize = DELIVERY_TOKEN_BYTES + 32;

const _: () = assert!(FRAME_HEADER_BYTES.is_multiple_of(FRAME_ALIGN));
const _: () = assert!(SESSION_TIMEOUT_MS_MIN < SESSION_TIMEOUT_MS_MAX);
const _: () = assert!(MAX_FRAME_BYTES.is_multiple_of(FRAME_ALIGN));
const _: () = assert!(MAX_FRAME_BYTES <= u32::MAX as usize);
const _: () = assert!(CLAIM_DELIVERY_HEADER_BYTES.is_multiple_of(FRAME_ALIGN));
// The largest Enqueue: header, queue name, fixed fields, alignment, full batch.
const _: () = assert!(
    FRAME_HEADER_BYTES + 2 + QUEUE_NAME_BYTES_MAX + 8 + FRAME_ALIGN + BATCH_BYTES_MAX
        <= MAX_FRAME_BYTES
);
// The largest Claim response: records up to max_bytes (the broker stops before
// exceeding it, except that a first record larger than max_bytes is still
// delivered, and a record is never larger than a claim's byte limit), plus every
// delivery's fixed part and padding.
const _: () = assert!(RECORD_BYTES_MAX <= CLAIM_BYTES_MAX as usize);
const _: () = assert!(
    FRAME_HEADER_BYTES
        + 16
        + (CLAIM_CREDITS_MAX as usize) * (CLAIM_DELIVERY_HEADER_BYTES + FRAME_ALIGN)
        + (CLAIM_BYTES_MAX as usize)
        <= MAX_FRAME_BYTES
);
const _: () = assert!(BATCH_HEADER_BYTES <= BATCH_BYTES_MAX);

/// Longest principal name in an Authenticate request, bytes.
pub const PRINCIPAL_BYTES_MAX: usize = 128;
/// Longest secret in an Authenticate request, bytes.
pub const SECRET_BYTES_MAX: usize = 1024;
