//! Snapshot transfer messages (`docs/design/replication.md` §6,
//! "Transfer"): what a member that needs a snapshot and the leader that
//! offered it say to each other, beside the group's raft messages.
//!
//! raft-rs's `MsgSnapshot` carries only the snapshot's (index, term) and a
//! short descriptor; the bytes (the checkpoint, the dedupe generation files
//! it refers to, the live record batches) are pulled by the member, one
//! piece per request, so a transfer holds at most one piece in flight and
//! never more than the peer link's bounds. The messages ride the
//! replication frame as raft `Message`s of type `MsgUnreachable` (a type
//! raft-rs only makes locally, never sends) with the transfer in their
//! `context`: a tag byte ([`SNAPSHOT_TAG`]), a kind byte, then the kind's
//! fields (little-endian). The shard's host takes them out before any
//! message reaches raft-rs. Decoding validates every length; anything else
//! is a typed [`SnapshotWireError`].

use raft::eraftpb::{Message, MessageType};
use thiserror::Error;

/// The first byte of a transfer message's `context` (the group floor's tag
/// is `0xF1`, `node.rs`).
pub const SNAPSHOT_TAG: u8 = 0xF2;

/// The descriptor raft-rs's `Snapshot::data` carries: the pieces come by
/// transfer.
pub const SNAPSHOT_DESCRIPTOR: &[u8] = b"spool-snapshot-v1";

/// One transfer message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transfer {
    /// Member → leader: send piece `piece` (from 0) of the snapshot at
    /// `index`.
    Pull { index: u64, piece: u64 },
    /// Leader → member: piece `piece` of the snapshot at `index`.
    Piece { index: u64, piece: u64, body: Piece },
    /// Leader → member: the snapshot at `index` cannot be served (a newer
    /// checkpoint replaced it, or it could not be read); the member drops
    /// its install and waits for the next offer.
    Gone { index: u64, reason: String },
    /// Member → leader: the snapshot at `index` is installed and durable.
    Installed { index: u64 },
    /// Member → leader: the offer at `index` is declined for now (the
    /// member installs as many as it may): offer again later.
    Declined { index: u64 },
}

/// What one piece holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    /// Bytes of a side file's payload from `at`: the checkpoint's state
    /// (name `checkpoint`, its prefix left out) or a dedupe generation
    /// file; `value` is the side file's header value; `last` ends it.
    File { name: String, value: u64, at: u64, last: bool, bytes: Vec<u8> },
    /// One data batch of the partition's log, as stored (offsets and epoch
    /// stamped).
    Batch { bytes: Vec<u8> },
    /// No more pieces; `covers` is the data offset the checkpoint covers.
    End { covers: u64 },
}

/// Why a transfer message could not be read.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum SnapshotWireError {
    #[error("snapshot transfer message shorter than its fields ({0})")]
    Short(&'static str),
    #[error("snapshot transfer message of unknown kind {0}")]
    Kind(u8),
    #[error("snapshot transfer message with trailing bytes")]
    Trailing,
    #[error("snapshot file name is not valid UTF-8")]
    Name,
}

const KIND_PULL: u8 = 1;
const KIND_FILE: u8 = 2;
const KIND_BATCH: u8 = 3;
const KIND_END: u8 = 4;
const KIND_GONE: u8 = 5;
const KIND_INSTALLED: u8 = 6;
const KIND_DECLINED: u8 = 7;

/// The `context` tag of a change a controller member that does not lead
/// forwards to its leader (`shard/controller_run.rs`): not for raft-rs
/// either, and taken out by the same host hook as transfers.
pub const FORWARD_TAG: u8 = 0xF4;

/// Whether `message` is a forwarded controller change.
pub fn is_forward(message: &Message) -> bool {
    message.get_msg_type() == MessageType::MsgUnreachable
        && message.get_context().first() == Some(&FORWARD_TAG)
}

/// Whether `message` is a transfer message (not for raft-rs).
pub fn is_transfer(message: &Message) -> bool {
    message.get_msg_type() == MessageType::MsgUnreachable
        && message.get_context().first() == Some(&SNAPSHOT_TAG)
}

/// The raft message carrying `transfer` from `from` to `to`.
pub fn encode(from: u64, to: u64, transfer: &Transfer) -> Message {
    let mut context = vec![SNAPSHOT_TAG];
    let put = |context: &mut Vec<u8>, value: u64| context.extend_from_slice(&value.to_le_bytes());
    match transfer {
        Transfer::Pull { index, piece } => {
            context.push(KIND_PULL);
            put(&mut context, *index);
            put(&mut context, *piece);
        }
        Transfer::Piece { index, piece, body } => {
            let kind = match body {
                Piece::File { .. } => KIND_FILE,
                Piece::Batch { .. } => KIND_BATCH,
                Piece::End { .. } => KIND_END,
            };
            context.push(kind);
            put(&mut context, *index);
            put(&mut context, *piece);
            match body {
                Piece::File { name, value, at, last, bytes } => {
                    put(&mut context, name.len() as u64);
                    context.extend_from_slice(name.as_bytes());
                    put(&mut context, *value);
                    put(&mut context, *at);
                    context.push(u8::from(*last));
                    context.extend_from_slice(bytes);
                }
                Piece::Batch { bytes } => context.extend_from_slice(bytes),
                Piece::End { covers } => put(&mut context, *covers),
            }
        }
        Transfer::Gone { index, reason } => {
            context.push(KIND_GONE);
            put(&mut context, *index);
            context.extend_from_slice(reason.as_bytes());
        }
        Transfer::Installed { index } => {
            context.push(KIND_INSTALLED);
            put(&mut context, *index);
        }
        Transfer::Declined { index } => {
            context.push(KIND_DECLINED);
            put(&mut context, *index);
        }
    }
    let mut message = Message::default();
    message.set_msg_type(MessageType::MsgUnreachable);
    message.from = from;
    message.to = to;
    message.context = context.into();
    message
}

/// Reads a transfer message's `context` (see [`is_transfer`]).
///
/// # Errors
/// A context too short for its kind's fields, an unknown kind, a name that
/// is not UTF-8, bytes after fixed-size fields.
pub fn decode(context: &[u8]) -> Result<Transfer, SnapshotWireError> {
    let rest = context.get(1..).ok_or(SnapshotWireError::Short("tag"))?;
    let (&kind, rest) = rest.split_first().ok_or(SnapshotWireError::Short("kind"))?;
    let mut reader = Reader(rest);
    let transfer = match kind {
        KIND_PULL => Transfer::Pull { index: reader.word("index")?, piece: reader.word("piece")? },
        KIND_INSTALLED => Transfer::Installed { index: reader.word("index")? },
        KIND_DECLINED => Transfer::Declined { index: reader.word("index")? },
        KIND_GONE => {
            let index = reader.word("index")?;
            let reason = String::from_utf8_lossy(reader.0).into_owned();
            return Ok(Transfer::Gone { index, reason });
        }
        KIND_END => {
            let (index, piece) = (reader.word("index")?, reader.word("piece")?);
            Transfer::Piece { index, piece, body: Piece::End { covers: reader.word("covers")? } }
        }
        KIND_BATCH => {
            let (index, piece) = (reader.word("index")?, reader.word("piece")?);
            let body = Piece::Batch { bytes: reader.0.to_vec() };
            return Ok(Transfer::Piece { index, piece, body });
        }
        KIND_FILE => {
            let (index, piece) = (reader.word("index")?, reader.word("piece")?);
            let len = usize::try_from(reader.word("name length")?).unwrap_or(usize::MAX);
            if reader.0.len() < len {
                return Err(SnapshotWireError::Short("name"));
            }
            let (name, tail) = reader.0.split_at(len);
            let name = std::str::from_utf8(name).map_err(|_| SnapshotWireError::Name)?.to_owned();
            reader.0 = tail;
            let (value, at) = (reader.word("value")?, reader.word("at")?);
            let (&last, bytes) = reader.0.split_first().ok_or(SnapshotWireError::Short("last"))?;
            let body = Piece::File { name, value, at, last: last != 0, bytes: bytes.to_vec() };
            return Ok(Transfer::Piece { index, piece, body });
        }
        other => return Err(SnapshotWireError::Kind(other)),
    };
    if !reader.0.is_empty() {
        return Err(SnapshotWireError::Trailing);
    }
    Ok(transfer)
}

/// The unread rest of a context.
struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn word(&mut self, what: &'static str) -> Result<u64, SnapshotWireError> {
        let (bytes, tail) =
            self.0.split_first_chunk::<8>().ok_or(SnapshotWireError::Short(what))?;
        self.0 = tail;
        Ok(u64::from_le_bytes(*bytes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_transfer_message_round_trips_and_damage_is_refused() {
        // Goal: what the member and the leader say reads back as sent, is told apart from a
        // raft message, and a cut or unknown message is an error, never a wrong transfer.
        let all = [
            Transfer::Pull { index: 40, piece: 3 },
            Transfer::Installed { index: 40 },
            Transfer::Declined { index: 40 },
            Transfer::Gone { index: 40, reason: "a newer checkpoint".into() },
            Transfer::Piece { index: 40, piece: 0, body: Piece::End { covers: 99 } },
            Transfer::Piece { index: 40, piece: 1, body: Piece::Batch { bytes: vec![7; 100] } },
            Transfer::Piece {
                index: 40,
                piece: 2,
                body: Piece::File {
                    name: "dedupe-00000000000000000010-4.gen".into(),
                    value: 10,
                    at: 1 << 20,
                    last: true,
                    bytes: vec![1, 2, 3],
                },
            },
        ];
        for transfer in &all {
            let message = encode(1, 2, transfer);
            assert!(is_transfer(&message));
            assert_eq!((message.from, message.to), (1, 2));
            assert_eq!(decode(message.get_context()).as_ref(), Ok(transfer));
        }
        let pull = encode(1, 2, &all[0]);
        let cut = &pull.get_context()[..pull.get_context().len() - 1];
        assert_eq!(decode(cut), Err(SnapshotWireError::Short("piece")));
        let mut longer = pull.get_context().to_vec();
        longer.push(0);
        assert_eq!(decode(&longer), Err(SnapshotWireError::Trailing));
        assert_eq!(decode(&[SNAPSHOT_TAG, 9]), Err(SnapshotWireError::Kind(9)));
        let mut heartbeat = Message::default();
        heartbeat.set_msg_type(MessageType::MsgHeartbeat);
        heartbeat.context = vec![SNAPSHOT_TAG].into();
        assert!(!is_transfer(&heartbeat));
    }
}
