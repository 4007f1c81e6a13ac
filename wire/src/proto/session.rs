//! Session (api key 9): a consumer session on one connection
//! (`docs/design/sessions.md`). One key with three operations — open,
//! heartbeat, close — because they share one body layout and one answer:
//! the session's id and epoch.
//!
//! Layout (hand-written, like the data path; little endian):
//!
//! ```text
//! request:
//! 0   u8  op            1 open, 2 heartbeat, 3 close
//! 1   [3] reserved      zero
//! 4   u32 timeout_ms    open: SESSION_TIMEOUT_MS_MIN..=MAX; else 0
//! 8   u64 session_id    heartbeat, close: the id open answered; open: 0
//! 16  str queue         u16 length + bytes; open only (else empty)
//!     str subscription  open: "" = the default subscription; else empty
//!     str member        open: 1..=SESSION_MEMBER_BYTES_MAX bytes; else empty
//! response:
//! 0   u64 session_id
//! 8   u64 epoch         above every earlier epoch of the member on the shard
//! 16  u32 timeout_ms    the timeout in force
//! 20  u32 reserved      zero
//! ```
//!
//! A heartbeat or close naming no open session of its connection is
//! answered `SESSION_NOT_FOUND`, one whose session a newer epoch of the
//! same member ended `SESSION_FENCED`. A broker that predates the key
//! answers `UNKNOWN_API`.

use super::codec::{check_range, validate_queue_name, validate_subscription_name, Reader, Writer};
use super::error::ProtoError;
use super::limits::{
    QUEUE_NAME_BYTES_MAX, SESSION_MEMBER_BYTES_MAX, SESSION_TIMEOUT_MS_MAX, SESSION_TIMEOUT_MS_MIN,
    SUBSCRIPTION_NAME_BYTES_MAX,
};

const OP_OPEN: u8 = 1;
const OP_HEARTBEAT: u8 = 2;
const OP_CLOSE: u8 = 3;

/// A session request: open one, keep one alive, or end one.
///
/// ```
/// use spool_wire::proto::{CorrelationId, Request, SessionRequest};
/// let open = SessionRequest::Open {
///     queue: "jobs",
///     subscription: "",
///     member: "worker-1",
///     timeout_ms: 2_000,
/// };
/// let mut bytes = Vec::new();
/// Request::Session(open).encode(CorrelationId(1), &mut bytes).unwrap();
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionRequest<'a> {
    /// Opens a session of `member` for `queue`'s `subscription` (`""`: the
    /// default) on this connection: claims this connection makes in that
    /// queue and subscription are recorded in it, and released at once
    /// when it ends (no heartbeat for `timeout_ms`, a close, the
    /// connection's end, or the member opening again).
    Open {
        /// The queue.
        queue: &'a str,
        /// The subscription, `""` for the default one.
        subscription: &'a str,
        /// Who the consumer is: a rejoin under the same id fences the
        /// older session.
        member: &'a str,
        /// How long the session lives without a heartbeat.
        timeout_ms: u32,
    },
    /// "Still here": pushes the session's deadline `timeout_ms` out.
    Heartbeat {
        /// The id open answered.
        session_id: u64,
    },
    /// Ends the session now: its claims are released at once.
    Close {
        /// The id open answered.
        session_id: u64,
    },
}

impl SessionRequest<'_> {
    /// Checks every field against its bounds.
    ///
    /// # Errors
    /// A queue or subscription name that breaks the names' rule; an empty
    /// or too long member id; a timeout outside
    /// `SESSION_TIMEOUT_MS_MIN..=SESSION_TIMEOUT_MS_MAX`; session id 0.
    pub fn validate(&self) -> Result<(), ProtoError> {
        match *self {
            Self::Open { queue, subscription, member, timeout_ms } => {
                validate_queue_name(queue)?;
                if !subscription.is_empty() {
                    validate_subscription_name(subscription)?;
                }
                check_range(
                    "member length",
                    member.len() as u64,
                    1,
                    SESSION_MEMBER_BYTES_MAX as u64,
                )?;
                check_range(
                    "timeout_ms",
                    timeout_ms.into(),
                    SESSION_TIMEOUT_MS_MIN.into(),
                    SESSION_TIMEOUT_MS_MAX.into(),
                )
            }
            Self::Heartbeat { session_id } | Self::Close { session_id } => {
                check_range("session_id", session_id, 1, u64::MAX)
            }
        }
    }

    pub(crate) fn write(&self, writer: &mut Writer<'_>) {
        let (op, timeout_ms, session_id, queue, subscription, member) = match *self {
            Self::Open { queue, subscription, member, timeout_ms } => {
                (OP_OPEN, timeout_ms, 0, queue, subscription, member)
            }
            Self::Heartbeat { session_id } => (OP_HEARTBEAT, 0, session_id, "", "", ""),
            Self::Close { session_id } => (OP_CLOSE, 0, session_id, "", "", ""),
        };
        writer.u8(op);
        writer.bytes(&[0; 3]);
        writer.u32(timeout_ms);
        writer.u64(session_id);
        writer.str(queue);
        writer.str(subscription);
        writer.str(member);
    }
}

impl<'a> SessionRequest<'a> {
    pub(crate) fn read(body: &'a [u8]) -> Result<Self, ProtoError> {
        let mut reader = Reader::new(body);
        let op = reader.u8()?;
        if reader.array::<3>()? != [0; 3] {
            return Err(ProtoError::NonzeroReserved { field: "session reserved" });
        }
        let timeout_ms = reader.u32()?;
        let session_id = reader.u64()?;
        let queue = reader.str("queue", QUEUE_NAME_BYTES_MAX)?;
        let subscription = reader.str("subscription", SUBSCRIPTION_NAME_BYTES_MAX)?;
        let member = reader.str("member", SESSION_MEMBER_BYTES_MAX)?;
        reader.finish()?;
        let request = match op {
            OP_OPEN => {
                if session_id != 0 {
                    return Err(ProtoError::Inconsistent("a session open names no session id"));
                }
                Self::Open { queue, subscription, member, timeout_ms }
            }
            OP_HEARTBEAT | OP_CLOSE => {
                if timeout_ms != 0
                    || !queue.is_empty()
                    || !subscription.is_empty()
                    || !member.is_empty()
                {
                    return Err(ProtoError::Inconsistent(
                        "a session heartbeat or close carries only the session id",
                    ));
                }
                if op == OP_HEARTBEAT {
                    Self::Heartbeat { session_id }
                } else {
                    Self::Close { session_id }
                }
            }
            other => {
                return Err(ProtoError::UnknownEnumValue {
                    field: "session op",
                    value: other.into(),
                })
            }
        };
        request.validate()?;
        Ok(request)
    }
}

/// The answer to every session operation: which session, its epoch and
/// its timeout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionResponse {
    /// The session's id on this connection's shard.
    pub session_id: u64,
    /// The member's epoch on this shard: above every earlier one.
    pub epoch: u64,
    /// The timeout in force.
    pub timeout_ms: u32,
}

impl SessionResponse {
    pub(crate) fn write(&self, writer: &mut Writer<'_>) {
        writer.u64(self.session_id);
        writer.u64(self.epoch);
        writer.u32(self.timeout_ms);
        writer.u32(0);
    }

    pub(crate) fn read(body: &[u8]) -> Result<Self, ProtoError> {
        let mut reader = Reader::new(body);
        let session_id = reader.u64()?;
        let epoch = reader.u64()?;
        let timeout_ms = reader.u32()?;
        reader.reserved_u32("session response reserved")?;
        reader.finish()?;
        Ok(Self { session_id, epoch, timeout_ms })
    }
}

// The member id is length-prefixed by a u16.
const _: () = assert!(SESSION_MEMBER_BYTES_MAX <= u16::MAX as usize);
