//! Inspection and repair messages of one partition: Peek (messages from an
//! offset on, with their state, unclaimed), Purge (drop or count the ready
//! and scheduled messages), DeadLetters (the quarantined ones and their
//! evidence) and Redrive (move dead letters back to ready). From
//! [`INSPECT_VERSION_SUBSCRIPTION`] each names the subscription it acts in
//! (empty: the queue's default); an older version's request is the default's.
//!
//! Owns these structs, their `validate` and their flatbuffers layout. It
//! must not read records (a peeked record stays archived bytes, checked only
//! for its length) nor decide which messages qualify: the broker does.

use flatbuffers::{FlatBufferBuilder, WIPOffset};

use super::{checked_string, finish, required, root, vector_len};
use crate::limits::{RECORD_BYTES_MAX, ROUTING_KEY_BYTES_MAX};
use crate::proto::codec::{
    check_len, check_range, validate_queue_name, validate_subscription_name,
};
use crate::proto::control_generated::spool::control as fb;
use crate::proto::error::ProtoError;
use crate::proto::frame::INSPECT_VERSION_SUBSCRIPTION;
use crate::proto::ids::{Offset, PartitionId};
use crate::proto::limits::{INSPECT_MESSAGES_MAX, REDRIVE_OFFSETS_MAX, RELEASE_REASON_BYTES_MAX};

fn count_to_wire(count: u64) -> u64 {
    count
}

/// An inspection request's subscription: empty (the default) or a valid name.
fn validate_optional_subscription(subscription: &str) -> Result<(), ProtoError> {
    if subscription.is_empty() {
        return Ok(());
    }
    validate_subscription_name(subscription)
}

/// The subscription field, written only when one is named: a request for
/// the default is byte for byte what version 1 sent.
fn optional_string<'b>(
    builder: &mut FlatBufferBuilder<'b>,
    value: &str,
) -> Option<WIPOffset<&'b str>> {
    (!value.is_empty()).then(|| builder.create_string(value))
}

/// The subscription a request of `version` names: the field from
/// [`INSPECT_VERSION_SUBSCRIPTION`] on; before it, whatever the bytes hold,
/// the default (an older client never meant another).
fn subscription_at(field: Option<&str>, version: u16) -> String {
    if version >= INSPECT_VERSION_SUBSCRIPTION {
        field.unwrap_or_default().to_owned()
    } else {
        String::new()
    }
}

/// Refuses a subscription named in a version before
/// [`INSPECT_VERSION_SUBSCRIPTION`] (the encoder's check: such a request
/// would reach the broker as one for the default).
pub(crate) fn check_subscription_version(
    subscription: &str,
    version: u16,
) -> Result<(), ProtoError> {
    if !subscription.is_empty() && version < INSPECT_VERSION_SUBSCRIPTION {
        return Err(ProtoError::Inconsistent(
            "an inspection request naming a subscription needs version 2",
        ));
    }
    Ok(())
}

// ------------------------------------------------------------ Peek

/// Read messages from `from_offset` on without claiming them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeekRequest {
    /// Queue name.
    pub queue: String,
    /// Partition.
    pub partition: PartitionId,
    /// First offset to look at.
    pub from_offset: Offset,
    /// `1..=INSPECT_MESSAGES_MAX` messages.
    pub max: u32,
    /// The subscription (empty: the queue's default). Carried from
    /// [`INSPECT_VERSION_SUBSCRIPTION`]; an older request decodes as empty.
    pub subscription: String,
}

inspect_request_codec!(PeekRequest, PeekRequestArgs);

/// A message's state, as inspection reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MessageState {
    /// Claimable now.
    Ready,
    /// Waiting for its not_before.
    Scheduled,
    /// Leased.
    Claimed,
    /// Done.
    Acked,
    /// Dead-lettered.
    Quarantined,
    /// Passed its expiry.
    Expired,
    /// Behind an earlier message of its routing key (an ordered queue):
    /// claimable once every earlier one is finished.
    Waiting,
}

impl MessageState {
    fn to_fb(self) -> fb::MessageState {
        match self {
            Self::Ready => fb::MessageState::Ready,
            Self::Scheduled => fb::MessageState::Scheduled,
            Self::Claimed => fb::MessageState::Claimed,
            Self::Acked => fb::MessageState::Acked,
            Self::Quarantined => fb::MessageState::Quarantined,
            Self::Expired => fb::MessageState::Expired,
            Self::Waiting => fb::MessageState::Waiting,
        }
    }

    fn from_fb(state: fb::MessageState) -> Result<Self, ProtoError> {
        Ok(match state {
            fb::MessageState::Ready => Self::Ready,
            fb::MessageState::Scheduled => Self::Scheduled,
            fb::MessageState::Claimed => Self::Claimed,
            fb::MessageState::Acked => Self::Acked,
            fb::MessageState::Quarantined => Self::Quarantined,
            fb::MessageState::Expired => Self::Expired,
            fb::MessageState::Waiting => Self::Waiting,
            other => {
                return Err(ProtoError::UnknownEnumValue { field: "state", value: other.0.into() })
            }
        })
    }
}

/// One message as Peek shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeekedMessage {
    /// Its offset.
    pub offset: Offset,
    /// Its state.
    pub state: MessageState,
    /// Deliveries so far.
    pub attempt: u32,
    /// The archived record bytes.
    pub record: Vec<u8>,
}

/// Result of a Peek.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PeekResponse {
    /// At most the request's `max`.
    pub messages: Vec<PeekedMessage>,
}

impl PeekResponse {
    /// # Errors
    /// Too many messages or an oversized record.
    pub fn validate(&self) -> Result<(), ProtoError> {
        check_len("messages", self.messages.len(), INSPECT_MESSAGES_MAX as usize)?;
        self.messages
            .iter()
            .try_for_each(|message| check_len("record", message.record.len(), RECORD_BYTES_MAX))
    }

    pub(crate) fn write(&self, out: &mut Vec<u8>) {
        let mut builder = FlatBufferBuilder::new();
        let messages: Vec<_> = self
            .messages
            .iter()
            .map(|message| {
                let record = builder.create_vector(&message.record);
                fb::PeekedMessage::create(
                    &mut builder,
                    &fb::PeekedMessageArgs {
                        offset: message.offset.0,
                        state: message.state.to_fb(),
                        attempt: message.attempt,
                        record: Some(record),
                    },
                )
            })
            .collect();
        let messages = builder.create_vector(&messages);
        let root = fb::PeekResponse::create(
            &mut builder,
            &fb::PeekResponseArgs { messages: Some(messages) },
        );
        finish(builder, root, out);
    }

    pub(crate) fn read(body: &[u8]) -> Result<Self, ProtoError> {
        let table = root::<fb::PeekResponse<'_>>(body)?;
        let vector = table.messages();
        vector_len(&vector, "messages", INSPECT_MESSAGES_MAX as usize)?;
        let messages = vector
            .into_iter()
            .flatten()
            .map(|message| {
                let record = message.record().map_or(&[][..], |record| record.bytes());
                check_len("record", record.len(), RECORD_BYTES_MAX)?;
                Ok(PeekedMessage {
                    offset: Offset(message.offset()),
                    state: MessageState::from_fb(message.state())?,
                    attempt: message.attempt(),
                    record: record.to_vec(),
                })
            })
            .collect::<Result<_, ProtoError>>()?;
        Ok(Self { messages })
    }
}

// ------------------------------------------------------------ Purge

/// Drop every ready and scheduled message of a partition (or count them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PurgeRequest {
    /// Queue name.
    pub queue: String,
    /// Partition.
    pub partition: PartitionId,
    /// Count only; change nothing.
    pub dry_run: bool,
    /// The subscription (empty: the queue's default). Carried from
    /// [`INSPECT_VERSION_SUBSCRIPTION`]; an older request decodes as empty.
    pub subscription: String,
}

impl PurgeRequest {
    /// # Errors
    /// Invalid name or subscription name.
    pub fn validate(&self) -> Result<(), ProtoError> {
        validate_queue_name(&self.queue)?;
        validate_optional_subscription(&self.subscription)
    }

    pub(crate) fn write(&self, out: &mut Vec<u8>) {
        let mut builder = FlatBufferBuilder::new();
        let queue = builder.create_string(&self.queue);
        let subscription = optional_string(&mut builder, &self.subscription);
        let root = fb::PurgeRequest::create(
            &mut builder,
            &fb::PurgeRequestArgs {
                queue: Some(queue),
                partition: self.partition.0,
                dry_run: self.dry_run,
                subscription,
            },
        );
        finish(builder, root, out);
    }

    pub(crate) fn read(body: &[u8], version: u16) -> Result<Self, ProtoError> {
        let table = root::<fb::PurgeRequest<'_>>(body)?;
        let request = Self {
            queue: required(table.queue(), "queue")?.to_owned(),
            partition: PartitionId(table.partition()),
            dry_run: table.dry_run(),
            subscription: subscription_at(table.subscription(), version),
        };
        request.validate()?;
        Ok(request)
    }
}

/// Result of a Purge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PurgeResponse {
    /// Messages purged (or that a dry run would purge).
    pub count: u64,
}

scalar_response_codec!(PurgeResponse, PurgeResponseArgs, count: count_to_wire, count_to_wire);

// ------------------------------------------------------------ DeadLetters

/// List a partition's dead letters from `from_offset` on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLettersRequest {
    /// Queue name.
    pub queue: String,
    /// Partition.
    pub partition: PartitionId,
    /// First original offset to list.
    pub from_offset: Offset,
    /// `1..=INSPECT_MESSAGES_MAX` entries.
    pub max: u32,
    /// The subscription (empty: the queue's default). Carried from
    /// [`INSPECT_VERSION_SUBSCRIPTION`]; an older request decodes as empty.
    pub subscription: String,
}

inspect_request_codec!(DeadLettersRequest, DeadLettersRequestArgs);

/// One quarantined message and its evidence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetter {
    /// Offset in the source partition.
    pub original_offset: Offset,
    /// Its routing key.
    pub routing_key: String,
    /// Deliveries before quarantine.
    pub attempts: u32,
    /// The last release reason (empty if none).
    pub last_reason: String,
    /// Unix ms.
    pub enqueued_at_ms: u64,
    /// Unix ms.
    pub last_claimed_at_ms: u64,
    /// Unix ms.
    pub quarantined_at_ms: u64,
}

/// Result of a DeadLetters request.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DeadLettersResponse {
    /// At most the request's `max`.
    pub entries: Vec<DeadLetter>,
}

impl DeadLettersResponse {
    /// # Errors
    /// Too many entries, oversized strings.
    pub fn validate(&self) -> Result<(), ProtoError> {
        check_len("entries", self.entries.len(), INSPECT_MESSAGES_MAX as usize)?;
        for entry in &self.entries {
            checked_string(&entry.routing_key, "routing_key", ROUTING_KEY_BYTES_MAX)?;
            checked_string(&entry.last_reason, "last_reason", RELEASE_REASON_BYTES_MAX)?;
        }
        Ok(())
    }

    pub(crate) fn write(&self, out: &mut Vec<u8>) {
        let mut builder = FlatBufferBuilder::new();
        let entries: Vec<_> = self
            .entries
            .iter()
            .map(|entry| {
                let routing_key = builder.create_string(&entry.routing_key);
                let last_reason = builder.create_string(&entry.last_reason);
                fb::DeadLetter::create(
                    &mut builder,
                    &fb::DeadLetterArgs {
                        original_offset: entry.original_offset.0,
                        routing_key: Some(routing_key),
                        attempts: entry.attempts,
                        last_reason: Some(last_reason),
                        enqueued_at_ms: entry.enqueued_at_ms,
                        last_claimed_at_ms: entry.last_claimed_at_ms,
                        quarantined_at_ms: entry.quarantined_at_ms,
                    },
                )
            })
            .collect();
        let entries = builder.create_vector(&entries);
        let root = fb::DeadLettersResponse::create(
            &mut builder,
            &fb::DeadLettersResponseArgs { entries: Some(entries) },
        );
        finish(builder, root, out);
    }

    pub(crate) fn read(body: &[u8]) -> Result<Self, ProtoError> {
        let table = root::<fb::DeadLettersResponse<'_>>(body)?;
        let vector = table.entries();
        vector_len(&vector, "entries", INSPECT_MESSAGES_MAX as usize)?;
        let entries = vector
            .into_iter()
            .flatten()
            .map(|entry| DeadLetter {
                original_offset: Offset(entry.original_offset()),
                routing_key: entry.routing_key().unwrap_or_default().to_owned(),
                attempts: entry.attempts(),
                last_reason: entry.last_reason().unwrap_or_default().to_owned(),
                enqueued_at_ms: entry.enqueued_at_ms(),
                last_claimed_at_ms: entry.last_claimed_at_ms(),
                quarantined_at_ms: entry.quarantined_at_ms(),
            })
            .collect();
        let response = Self { entries };
        response.validate()?;
        Ok(response)
    }
}

// ------------------------------------------------------------ Redrive

/// Which dead letters a Redrive moves back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RedriveTarget {
    /// Every dead letter of the partition.
    All,
    /// These original offsets, `1..=REDRIVE_OFFSETS_MAX` of them.
    Offsets(Vec<Offset>),
}

/// Move dead letters back to ready.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedriveRequest {
    /// Queue name.
    pub queue: String,
    /// Partition.
    pub partition: PartitionId,
    /// Which ones.
    pub target: RedriveTarget,
    /// The subscription (empty: the queue's default). Carried from
    /// [`INSPECT_VERSION_SUBSCRIPTION`]; an older request decodes as empty.
    pub subscription: String,
}

impl RedriveRequest {
    /// # Errors
    /// Invalid name or subscription name, or an offset list empty or too
    /// long.
    pub fn validate(&self) -> Result<(), ProtoError> {
        validate_queue_name(&self.queue)?;
        validate_optional_subscription(&self.subscription)?;
        if let RedriveTarget::Offsets(offsets) = &self.target {
            check_range("redrive offsets", offsets.len() as u64, 1, REDRIVE_OFFSETS_MAX as u64)?;
        }
        Ok(())
    }

    pub(crate) fn write(&self, out: &mut Vec<u8>) {
        let mut builder = FlatBufferBuilder::new();
        let queue = builder.create_string(&self.queue);
        let (all, offsets) = match &self.target {
            RedriveTarget::All => (true, None),
            RedriveTarget::Offsets(offsets) => {
                let raw: Vec<u64> = offsets.iter().map(|offset| offset.0).collect();
                (false, Some(builder.create_vector(&raw)))
            }
        };
        let subscription = optional_string(&mut builder, &self.subscription);
        let root = fb::RedriveRequest::create(
            &mut builder,
            &fb::RedriveRequestArgs {
                queue: Some(queue),
                partition: self.partition.0,
                all,
                offsets,
                subscription,
            },
        );
        finish(builder, root, out);
    }

    pub(crate) fn read(body: &[u8], version: u16) -> Result<Self, ProtoError> {
        let table = root::<fb::RedriveRequest<'_>>(body)?;
        let vector = table.offsets();
        let len = vector_len(&vector, "redrive offsets", REDRIVE_OFFSETS_MAX)?;
        let target = match (table.all(), len) {
            (true, 0) => RedriveTarget::All,
            (true, _) => {
                return Err(ProtoError::Inconsistent("redrive names offsets and `all`"));
            }
            (false, _) => RedriveTarget::Offsets(
                vector.into_iter().flatten().map(Offset).collect::<Vec<Offset>>(),
            ),
        };
        let request = Self {
            queue: required(table.queue(), "queue")?.to_owned(),
            partition: PartitionId(table.partition()),
            target,
            subscription: subscription_at(table.subscription(), version),
        };
        request.validate()?;
        Ok(request)
    }
}

/// Result of a Redrive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RedriveResponse {
    /// Messages moved back to ready.
    pub count: u64,
}

scalar_response_codec!(RedriveResponse, RedriveResponseArgs, count: count_to_wire, count_to_wire);
