//! Control-plane messages — queue admin, metadata, inspection — as plain Rust
//! structs, carried as flatbuffers (`wire/schema/control.fbs`) so clients in
//! other languages can generate their codecs.
//!
//! The generated code stays private: callers build and match these structs and
//! never see a flatbuffers type. Decoding runs the flatbuffers verifier with
//! tight bounds ([`FLATBUFFER_DEPTH_MAX`], [`FLATBUFFER_TABLES_MAX`], the frame
//! size) and then the same `validate` the encoder runs, so every length and
//! range is checked before the broker sees the value. Control-plane messages
//! are rare; they copy into owned structs rather than borrow.
//!
//! This file holds the plumbing every message shares (the bounded verifier,
//! required fields, vector counts, the codec macros); the messages live by
//! group: `queues` (a queue's configuration, CreateQueue, DeleteQueue,
//! ListQueues, DescribeQueue), `metadata` (where partitions live) and
//! `inspect` (Peek, Purge, DeadLetters, Redrive), `resize` (ResizeQueue)
//! and `subscriptions` (CreateSubscription, DeleteSubscription and the
//! subscriptions DescribeQueue v2 lists).

use flatbuffers::{FlatBufferBuilder, Follow, Vector, Verifiable, WIPOffset};

use super::codec::check_len;
use super::error::ProtoError;
use super::limits::{FLATBUFFER_DEPTH_MAX, FLATBUFFER_TABLES_MAX, MAX_FRAME_BYTES};

// ------------------------------------------------------------ plumbing

/// Verifies `body` as a `T` root under our bounds.
fn root<'a, T>(body: &'a [u8]) -> Result<T::Inner, ProtoError>
where
    T: 'a + Follow<'a> + Verifiable,
{
    let options = flatbuffers::VerifierOptions {
        max_depth: FLATBUFFER_DEPTH_MAX,
        max_tables: FLATBUFFER_TABLES_MAX,
        max_apparent_size: MAX_FRAME_BYTES,
        ignore_missing_null_terminator: false,
    };
    flatbuffers::root_with_opts::<T>(&options, body)
        .map_err(|error| ProtoError::InvalidFlatbuffer(error.to_string()))
}

fn required<T>(value: Option<T>, field: &'static str) -> Result<T, ProtoError> {
    value.ok_or(ProtoError::MissingField(field))
}

/// Elements of an optional vector, with the count checked before any copy.
fn vector_len<T>(
    vector: &Option<Vector<'_, T>>,
    field: &'static str,
    max: usize,
) -> Result<usize, ProtoError> {
    let len = vector.as_ref().map_or(0, |vector| vector.len());
    check_len(field, len, max)?;
    Ok(len)
}

fn finish<T>(mut builder: FlatBufferBuilder<'_>, root: WIPOffset<T>, out: &mut Vec<u8>) {
    builder.finish_minimal(root);
    out.extend_from_slice(builder.finished_data());
}

fn checked_string(value: &str, field: &'static str, max: usize) -> Result<(), ProtoError> {
    check_len(field, value.len(), max)
}

/// `write`/`read` for a table whose only field is a queue name (`name`).
macro_rules! name_request_codec {
    ($message:ident, $args:ident) => {
        impl $message {
            /// # Errors
            /// Invalid name.
            pub fn validate(&self) -> Result<(), ProtoError> {
                validate_queue_name(&self.name)
            }

            pub(crate) fn write(&self, out: &mut Vec<u8>) {
                let mut builder = FlatBufferBuilder::new();
                let name = builder.create_string(&self.name);
                let root = fb::$message::create(&mut builder, &fb::$args { name: Some(name) });
                finish(builder, root, out);
            }

            pub(crate) fn read(body: &[u8]) -> Result<Self, ProtoError> {
                let table = root::<fb::$message<'_>>(body)?;
                let request = Self { name: required(table.name(), "name")?.to_owned() };
                request.validate()?;
                Ok(request)
            }
        }
    };
}

/// `write`/`read` for a response table with one scalar field, given the
/// conversions between the Rust field and its wire scalar.
macro_rules! scalar_response_codec {
    ($message:ident, $args:ident, $field:ident: $to_wire:path, $from_wire:path) => {
        impl $message {
            pub(crate) fn write(&self, out: &mut Vec<u8>) {
                let mut builder = FlatBufferBuilder::new();
                let root = fb::$message::create(
                    &mut builder,
                    &fb::$args { $field: $to_wire(self.$field) },
                );
                finish(builder, root, out);
            }

            pub(crate) fn read(body: &[u8]) -> Result<Self, ProtoError> {
                let table = root::<fb::$message<'_>>(body)?;
                Ok(Self { $field: $from_wire(table.$field()) })
            }
        }
    };
}

/// `write`/`read` for an inspection request: queue, partition, first offset,
/// a `1..=INSPECT_MESSAGES_MAX` count and (from
/// [`INSPECT_VERSION_SUBSCRIPTION`](crate::proto::INSPECT_VERSION_SUBSCRIPTION))
/// the subscription, written only when one is named so an older version's
/// bytes are unchanged.
macro_rules! inspect_request_codec {
    ($message:ident, $args:ident) => {
        impl $message {
            /// # Errors
            /// Invalid name, subscription name or `max`.
            pub fn validate(&self) -> Result<(), ProtoError> {
                validate_queue_name(&self.queue)?;
                validate_optional_subscription(&self.subscription)?;
                check_range("max", self.max.into(), 1, INSPECT_MESSAGES_MAX.into())
            }

            pub(crate) fn write(&self, out: &mut Vec<u8>) {
                let mut builder = FlatBufferBuilder::new();
                let queue = builder.create_string(&self.queue);
                let subscription = optional_string(&mut builder, &self.subscription);
                let root = fb::$message::create(
                    &mut builder,
                    &fb::$args {
                        queue: Some(queue),
                        partition: self.partition.0,
                        from_offset: self.from_offset.0,
                        max: self.max,
                        subscription,
                    },
                );
                finish(builder, root, out);
            }

            pub(crate) fn read(body: &[u8], version: u16) -> Result<Self, ProtoError> {
                let table = root::<fb::$message<'_>>(body)?;
                let request = Self {
                    queue: required(table.queue(), "queue")?.to_owned(),
                    partition: PartitionId(table.partition()),
                    from_offset: Offset(table.from_offset()),
                    max: table.max(),
                    subscription: subscription_at(table.subscription(), version),
                };
                request.validate()?;
                Ok(request)
            }
        }
    };
}

// The macros above are in scope in these modules: declared after them.
mod inspect;
mod metadata;
mod queues;
mod resize;
mod subscriptions;

pub(crate) use inspect::check_subscription_version;
pub use inspect::{
    DeadLetter, DeadLettersRequest, DeadLettersResponse, MessageState, PeekRequest, PeekResponse,
    PeekedMessage, PurgeRequest, PurgeResponse, RedriveRequest, RedriveResponse, RedriveTarget,
};
pub use metadata::{MetadataRequest, MetadataResponse, PartitionMetadata, QueueMetadata};
pub use queues::{
    Backoff, BackoffKind, CreateQueueRequest, CreateQueueResponse, DeleteQueueRequest,
    DeleteQueueResponse, DescribeQueueRequest, DescribeQueueResponse, KeyMapStats, LaneStats,
    ListQueuesRequest, ListQueuesResponse, PartitionReplication, PartitionStats, QueueConfig,
    QueueSummary, RetainedStats,
};
pub use resize::{ResizeQueueRequest, ResizeQueueResponse};
pub use subscriptions::{
    CreateSubscriptionRequest, CreateSubscriptionResponse, DeleteSubscriptionRequest,
    DeleteSubscriptionResponse, SubscriptionStart, SubscriptionStats,
};
