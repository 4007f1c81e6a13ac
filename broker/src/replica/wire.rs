//! The replication frame: what one shard sends a peer shard in one turn —
//! the raft messages of every group (partition) they share, batched
//! (`docs/design/replication.md` §5).
//!
//! ```text
//! header (32 bytes, little-endian)
//!   magic     u32  "SPRF"
//!   version   u16  1
//!   flags     u16  0
//!   len       u32  the whole frame, header included
//!   count     u32  messages
//!   from      u64  the sending node (every message's `from` must be it)
//!   body_crc  u32  crc32c of the body
//!   head_crc  u32  crc32c of the 28 bytes before it
//! body: `count` times
//!   group     u64  (queue id << 32) | partition
//!   len       u32  bytes of the message
//!   message   raft-rs `eraftpb::Message`, protobuf
//! ```
//!
//! Encoding is bounded ([`REPLICA_FRAME_BYTES_MAX`],
//! [`REPLICA_FRAME_MESSAGES_MAX`]): a message that does not fit is
//! refused, and the sender starts the next frame. Decoding validates once,
//! before anything is stepped: the header and its crc, the declared length
//! against the bytes and the bound, the body's crc, each message's length,
//! its protobuf form, and that it comes from the sending node. Any failure
//! is a typed [`FrameError`]; the connection that carried it is closed.
//!
//! [`REPLICA_FRAME_BYTES_MAX`]: super::limits::REPLICA_FRAME_BYTES_MAX
//! [`REPLICA_FRAME_MESSAGES_MAX`]: super::limits::REPLICA_FRAME_MESSAGES_MAX

use protobuf::Message as _;
use raft::eraftpb::Message;
use thiserror::Error;

use super::limits::{
    FRAME_HEADER_BYTES, MESSAGE_HEADER_BYTES, REPLICA_FRAME_BYTES_MAX, REPLICA_FRAME_MESSAGES_MAX,
    REPLICA_MESSAGE_BYTES_MAX,
};

const MAGIC: u32 = u32::from_le_bytes(*b"SPRF");
const VERSION: u16 = 1;

/// A partition's Raft group, cluster-wide: its queue's id (never reused)
/// and its partition number.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct GroupId {
    pub queue: u32,
    pub partition: u32,
}

impl GroupId {
    fn to_u64(self) -> u64 {
        (u64::from(self.queue) << 32) | u64::from(self.partition)
    }

    fn from_u64(value: u64) -> GroupId {
        GroupId { queue: (value >> 32) as u32, partition: value as u32 }
    }
}

/// Why a frame could not be built or read.
#[derive(Debug, Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum FrameError {
    #[error("frame full: {messages} messages, {bytes} bytes; the message goes in the next")]
    Full { messages: usize, bytes: usize },
    #[error("a message of {bytes} bytes is over the limit of {REPLICA_MESSAGE_BYTES_MAX}")]
    MessageTooLarge { bytes: usize },
    #[error("a message could not be encoded: {0}")]
    Encode(String),
    #[error("frame of {bytes} bytes is shorter than its {FRAME_HEADER_BYTES}-byte header")]
    Short { bytes: usize },
    #[error("not a replication frame (magic {magic:#010x})")]
    Magic { magic: u32 },
    #[error("replication frame version {version} is not known (this node reads {VERSION})")]
    Version { version: u16 },
    #[error("frame header crc mismatch")]
    HeaderCrc,
    #[error("frame declares {declared} bytes, {held} held (limit {REPLICA_FRAME_BYTES_MAX})")]
    Length { declared: usize, held: usize },
    #[error("frame declares {count} messages, over the limit of {REPLICA_FRAME_MESSAGES_MAX}")]
    Count { count: usize },
    #[error("frame body crc mismatch")]
    BodyCrc,
    #[error("message {at} runs past the frame's end")]
    Truncated { at: usize },
    #[error("frame body has {extra} bytes after its last message")]
    Trailing { extra: usize },
    #[error("message {at} is not a raft message: {reason}")]
    Decode { at: usize, reason: String },
    #[error("message {at} claims to be from member {claimed}, the frame from node {from}")]
    Impostor { at: usize, claimed: u64, from: u64 },
}

/// Builds one frame from node `from`. See the module docs.
#[derive(Debug)]
pub struct FrameBuilder {
    from: u64,
    bytes: Vec<u8>,
    count: usize,
}

impl FrameBuilder {
    /// An empty frame from node `from`.
    pub fn new(from: u64) -> FrameBuilder {
        FrameBuilder { from, bytes: vec![0; FRAME_HEADER_BYTES], count: 0 }
    }

    /// Messages so far.
    pub fn len(&self) -> usize {
        self.count
    }

    /// No message yet.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Adds `message` of `group`.
    ///
    /// # Errors
    /// [`FrameError::Full`] when it does not fit this frame (nothing was
    /// added: send this one and start the next); [`FrameError::MessageTooLarge`]
    /// when it fits no frame.
    pub fn push(&mut self, group: GroupId, message: &Message) -> Result<(), FrameError> {
        let encoded =
            message.write_to_bytes().map_err(|error| FrameError::Encode(error.to_string()))?;
        if encoded.len() > REPLICA_MESSAGE_BYTES_MAX {
            return Err(FrameError::MessageTooLarge { bytes: encoded.len() });
        }
        let after = self.bytes.len() + MESSAGE_HEADER_BYTES + encoded.len();
        if self.count == REPLICA_FRAME_MESSAGES_MAX || after > REPLICA_FRAME_BYTES_MAX {
            return Err(FrameError::Full { messages: self.count, bytes: self.bytes.len() });
        }
        self.bytes.extend_from_slice(&group.to_u64().to_le_bytes());
        self.bytes.extend_from_slice(&(encoded.len() as u32).to_le_bytes());
        self.bytes.extend_from_slice(&encoded);
        self.count += 1;
        Ok(())
    }

    /// The frame's bytes.
    pub fn finish(mut self) -> Vec<u8> {
        let len = self.bytes.len() as u32;
        let body_crc = crc32c::crc32c(&self.bytes[FRAME_HEADER_BYTES..]);
        let header = &mut self.bytes[..FRAME_HEADER_BYTES];
        header[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        header[4..6].copy_from_slice(&VERSION.to_le_bytes());
        header[6..8].copy_from_slice(&0u16.to_le_bytes());
        header[8..12].copy_from_slice(&len.to_le_bytes());
        header[12..16].copy_from_slice(&(self.count as u32).to_le_bytes());
        header[16..24].copy_from_slice(&self.from.to_le_bytes());
        header[24..28].copy_from_slice(&body_crc.to_le_bytes());
        let head_crc = crc32c::crc32c(&header[..28]);
        header[28..32].copy_from_slice(&head_crc.to_le_bytes());
        self.bytes
    }
}

/// A decoded frame.
#[derive(Debug, PartialEq)]
pub struct Frame {
    pub from: u64,
    pub messages: Vec<(GroupId, Message)>,
}

fn u16_at(bytes: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([bytes[at], bytes[at + 1]])
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
}

fn u64_at(bytes: &[u8], at: usize) -> u64 {
    u64::from(u32_at(bytes, at)) | (u64::from(u32_at(bytes, at + 4)) << 32)
}

/// The length a frame's header declares, once its first
/// [`FRAME_HEADER_BYTES`] have arrived — checked, so a reader knows how
/// much to read before it reads it.
///
/// # Errors
/// As [`decode`] for the header's own fields.
pub fn declared_len(header: &[u8]) -> Result<usize, FrameError> {
    if header.len() < FRAME_HEADER_BYTES {
        return Err(FrameError::Short { bytes: header.len() });
    }
    let magic = u32_at(header, 0);
    if magic != MAGIC {
        return Err(FrameError::Magic { magic });
    }
    let version = u16_at(header, 4);
    if version != VERSION {
        return Err(FrameError::Version { version });
    }
    if crc32c::crc32c(&header[..28]) != u32_at(header, 28) {
        return Err(FrameError::HeaderCrc);
    }
    let declared = u32_at(header, 8) as usize;
    if !(FRAME_HEADER_BYTES..=REPLICA_FRAME_BYTES_MAX).contains(&declared) {
        return Err(FrameError::Length { declared, held: header.len() });
    }
    let count = u32_at(header, 12) as usize;
    if count > REPLICA_FRAME_MESSAGES_MAX {
        return Err(FrameError::Count { count });
    }
    Ok(declared)
}

/// Reads a whole frame. See the module docs for what is checked.
///
/// # Errors
/// The first check that fails, as a [`FrameError`].
pub fn decode(bytes: &[u8]) -> Result<Frame, FrameError> {
    let declared = declared_len(bytes)?;
    if declared != bytes.len() {
        return Err(FrameError::Length { declared, held: bytes.len() });
    }
    let count = u32_at(bytes, 12) as usize;
    let from = u64_at(bytes, 16);
    let body = &bytes[FRAME_HEADER_BYTES..];
    if crc32c::crc32c(body) != u32_at(bytes, 24) {
        return Err(FrameError::BodyCrc);
    }
    let mut messages = Vec::with_capacity(count);
    let mut at = 0usize;
    for index in 0..count {
        if body.len() - at < MESSAGE_HEADER_BYTES {
            return Err(FrameError::Truncated { at: index });
        }
        let group = GroupId::from_u64(u64_at(body, at));
        let len = u32_at(body, at + 8) as usize;
        at += MESSAGE_HEADER_BYTES;
        if len > REPLICA_MESSAGE_BYTES_MAX || body.len() - at < len {
            return Err(FrameError::Truncated { at: index });
        }
        let message = Message::parse_from_bytes(&body[at..at + len])
            .map_err(|error| FrameError::Decode { at: index, reason: error.to_string() })?;
        if message.from != from {
            return Err(FrameError::Impostor { at: index, claimed: message.from, from });
        }
        at += len;
        messages.push((group, message));
    }
    if at != body.len() {
        return Err(FrameError::Trailing { extra: body.len() - at });
    }
    Ok(Frame { from, messages })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use raft::eraftpb::{Entry, MessageType};

    fn message(from: u64, to: u64, entries: &[(u64, u64, Vec<u8>)]) -> Message {
        let mut message = Message {
            msg_type: MessageType::MsgAppend,
            from,
            to,
            term: 3,
            log_term: 2,
            index: 7,
            commit: 5,
            ..Message::default()
        };
        message.entries = entries
            .iter()
            .map(|(index, term, data)| Entry {
                index: *index,
                term: *term,
                data: data.clone().into(),
                ..Entry::default()
            })
            .collect::<Vec<_>>()
            .into();
        message
    }

    fn frame(messages: &[(GroupId, Message)]) -> Vec<u8> {
        let mut builder = FrameBuilder::new(1);
        for (group, message) in messages {
            builder.push(*group, message).expect("fits");
        }
        builder.finish()
    }

    proptest! {
        #[test]
        fn frames_round_trip(
            batches in prop::collection::vec(
                (any::<u32>(), any::<u32>(), 2u64..6,
                 prop::collection::vec((1u64..1000, 1u64..9, prop::collection::vec(any::<u8>(), 0..64)), 0..5)),
                0..20)
        ) {
            let messages: Vec<(GroupId, Message)> = batches
                .into_iter()
                .map(|(queue, partition, to, entries)| {
                    (GroupId { queue, partition }, message(1, to, &entries))
                })
                .collect();
            let decoded = decode(&frame(&messages)).expect("a frame it built");
            prop_assert_eq!(decoded.from, 1);
            prop_assert_eq!(decoded.messages, messages);
        }

        /// Any single flipped bit is refused, never read as other messages.
        #[test]
        fn a_flipped_bit_is_refused(bit in 0usize..(8 * 200)) {
            let group = GroupId { queue: 4, partition: 2 };
            let messages = vec![(group, message(1, 2, &[(8, 3, vec![7; 40])])), (group, message(1, 3, &[]))];
            let mut bytes = frame(&messages);
            let bit = bit % (bytes.len() * 8);
            bytes[bit / 8] ^= 1 << (bit % 8);
            prop_assert!(decode(&bytes).is_err());
        }
    }

    #[test]
    fn a_message_from_another_member_is_refused() {
        let group = GroupId { queue: 1, partition: 0 };
        let mut builder = FrameBuilder::new(2);
        builder.push(group, &message(3, 1, &[])).expect("fits");
        let refused = decode(&builder.finish());
        assert_eq!(refused, Err(FrameError::Impostor { at: 0, claimed: 3, from: 2 }));
    }

    #[test]
    fn a_full_frame_refuses_the_next_message_and_keeps_what_it_has() {
        let group = GroupId { queue: 1, partition: 0 };
        let big = message(1, 2, &[(1, 1, vec![0; 3 << 20])]);
        let mut builder = FrameBuilder::new(1);
        builder.push(group, &big).expect("one fits");
        builder.push(group, &big).expect("two fit");
        assert!(matches!(builder.push(group, &big), Err(FrameError::Full { messages: 2, .. })));
        let decoded = decode(&builder.finish()).expect("the two");
        assert_eq!(decoded.messages.len(), 2);
        let huge = message(1, 2, &[(1, 1, vec![0; REPLICA_MESSAGE_BYTES_MAX])]);
        let refused = FrameBuilder::new(1).push(group, &huge);
        assert!(matches!(refused, Err(FrameError::MessageTooLarge { .. })));
    }

    #[test]
    fn headers_are_checked_before_the_body_is_read() {
        let bytes = frame(&[(GroupId { queue: 1, partition: 1 }, message(1, 2, &[]))]);
        assert_eq!(declared_len(&bytes[..FRAME_HEADER_BYTES]), Ok(bytes.len()));
        assert!(matches!(declared_len(&bytes[..10]), Err(FrameError::Short { .. })));
        let mut lying = bytes.clone();
        lying[8..12].copy_from_slice(&(REPLICA_FRAME_BYTES_MAX as u32 + 1).to_le_bytes());
        let crc = crc32c::crc32c(&lying[..28]);
        lying[28..32].copy_from_slice(&crc.to_le_bytes());
        assert!(matches!(declared_len(&lying), Err(FrameError::Length { .. })));
        let mut other = bytes.clone();
        other[4] = 9;
        assert!(matches!(declared_len(&other), Err(FrameError::Version { version: 9 })));
        assert!(matches!(decode(&bytes[..bytes.len() - 1]), Err(FrameError::Length { .. })));
    }
}
