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

use flatbuffers::{FlatBufferBuilder, Follow, Vector, Verifiable, WIPOffset};

use super::codec::{check_len, check_range, validate_queue_name};
use super::control_generated::spool::control as fb;
use super::error::ProtoError;
use super::ids::{AssignmentVersion, LeaderEpoch, Offset, PartitionId};
use super::limits::{
    BACKOFF_CAP_MS_MAX, DEDUPE_WINDOW_MS_MAX, FLATBUFFER_DEPTH_MAX, FLATBUFFER_TABLES_MAX,
    HOST_BYTES_MAX, INSPECT_MESSAGES_MAX, LEASE_LIFETIME_MS_MAX, LEASE_MS_MAX, LEASE_MS_MIN,
    MAX_DELIVERIES_MAX, MAX_FRAME_BYTES, PARTITIONS_MAX, QUEUES_LISTED_MAX, REDRIVE_OFFSETS_MAX,
    RELEASE_REASON_BYTES_MAX,
};
use crate::limits::{PRIORITY_BANDS_MAX, RECORD_BYTES_MAX, ROUTING_KEY_BYTES_MAX};

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

/// `write`/`read` for an inspection request: queue, partition, first offset
/// and a `1..=INSPECT_MESSAGES_MAX` count.
macro_rules! inspect_request_codec {
    ($message:ident, $args:ident) => {
        impl $message {
            /// # Errors
            /// Invalid name or `max`.
            pub fn validate(&self) -> Result<(), ProtoError> {
                validate_queue_name(&self.queue)?;
                check_range("max", self.max.into(), 1, INSPECT_MESSAGES_MAX.into())
            }

            pub(crate) fn write(&self, out: &mut Vec<u8>) {
                let mut builder = FlatBufferBuilder::new();
                let queue = builder.create_string(&self.queue);
                let root = fb::$message::create(
                    &mut builder,
                    &fb::$args {
                        queue: Some(queue),
                        partition: self.partition.0,
                        from_offset: self.from_offset.0,
                        max: self.max,
                    },
                );
                finish(builder, root, out);
            }

            pub(crate) fn read(body: &[u8]) -> Result<Self, ProtoError> {
                let table = root::<fb::$message<'_>>(body)?;
                let request = Self {
                    queue: required(table.queue(), "queue")?.to_owned(),
                    partition: PartitionId(table.partition()),
                    from_offset: Offset(table.from_offset()),
                    max: table.max(),
                };
                request.validate()?;
                Ok(request)
            }
        }
    };
}

fn version_to_wire(version: AssignmentVersion) -> u64 {
    version.0
}

fn count_to_wire(count: u64) -> u64 {
    count
}

// ------------------------------------------------------------ queue config

/// How a released message's delay grows with its attempt count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackoffKind {
    /// `base_ms * attempt`, capped.
    Linear,
    /// `base_ms * 2^(attempt-1)`, capped.
    Exponential,
}

/// A queue's release backoff policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// Growth.
    pub kind: BackoffKind,
    /// First delay.
    pub base_ms: u32,
    /// Largest delay.
    pub cap_ms: u32,
}

/// A queue's configuration, as created and described.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueConfig {
    /// `1..=PARTITIONS_MAX`.
    pub partitions: u32,
    /// `1..=PRIORITY_BANDS_MAX`.
    pub priority_bands: u8,
    /// The lease client libraries use when the caller names none; within
    /// `lease_min_ms..=lease_max_ms`.
    pub lease_default_ms: u32,
    /// Shortest lease a claim or extend may ask for.
    pub lease_min_ms: u32,
    /// Longest lease a claim or extend may ask for.
    pub lease_max_ms: u32,
    /// Longest total time one claim may be held, extensions included.
    pub max_lease_lifetime_ms: u64,
    /// Claims without an ack before quarantine.
    pub max_deliveries: u32,
    /// Release delay policy when a release names no delay.
    pub backoff: Backoff,
    /// How long a message id deduplicates enqueues.
    pub dedupe_window_ms: u64,
    /// Admission limit on stored messages.
    pub max_messages: u64,
    /// Admission limit on stored bytes.
    pub max_bytes: u64,
    /// Whether expired messages are dead-lettered (else only counted).
    pub dead_letter_on_expiry: bool,
}

impl QueueConfig {
    /// Checks every absolute range and the order of the lease bounds.
    ///
    /// # Errors
    /// [`ProtoError::OutOfRange`], [`ProtoError::Inconsistent`].
    pub fn validate(&self) -> Result<(), ProtoError> {
        check_range("partitions", self.partitions.into(), 1, PARTITIONS_MAX.into())?;
        check_range("priority_bands", self.priority_bands.into(), 1, PRIORITY_BANDS_MAX.into())?;
        let lease = |field, value: u32| {
            check_range(field, value.into(), LEASE_MS_MIN.into(), LEASE_MS_MAX.into())
        };
        lease("lease_min_ms", self.lease_min_ms)?;
        lease("lease_max_ms", self.lease_max_ms)?;
        lease("lease_default_ms", self.lease_default_ms)?;
        if !(self.lease_min_ms <= self.lease_default_ms
            && self.lease_default_ms <= self.lease_max_ms)
        {
            return Err(ProtoError::Inconsistent(
                "need lease_min_ms <= lease_default_ms <= lease_max_ms",
            ));
        }
        check_range(
            "max_lease_lifetime_ms",
            self.max_lease_lifetime_ms,
            self.lease_max_ms.into(),
            LEASE_LIFETIME_MS_MAX,
        )?;
        check_range("max_deliveries", self.max_deliveries.into(), 1, MAX_DELIVERIES_MAX.into())?;
        check_range("backoff.cap_ms", self.backoff.cap_ms.into(), 0, BACKOFF_CAP_MS_MAX.into())?;
        if self.backoff.base_ms > self.backoff.cap_ms {
            return Err(ProtoError::Inconsistent("need backoff base_ms <= cap_ms"));
        }
        check_range("dedupe_window_ms", self.dedupe_window_ms, 0, DEDUPE_WINDOW_MS_MAX)?;
        check_range("max_messages", self.max_messages, 1, u64::MAX)?;
        check_range("max_bytes", self.max_bytes, 1, u64::MAX)
    }

    fn build<'b>(&self, builder: &mut FlatBufferBuilder<'b>) -> WIPOffset<fb::QueueConfig<'b>> {
        let backoff = fb::Backoff::create(
            builder,
            &fb::BackoffArgs {
                kind: match self.backoff.kind {
                    BackoffKind::Linear => fb::BackoffKind::Linear,
                    BackoffKind::Exponential => fb::BackoffKind::Exponential,
                },
                base_ms: self.backoff.base_ms,
                cap_ms: self.backoff.cap_ms,
            },
        );
        fb::QueueConfig::create(
            builder,
            &fb::QueueConfigArgs {
                partitions: self.partitions,
                priority_bands: self.priority_bands,
                lease_default_ms: self.lease_default_ms,
                lease_min_ms: self.lease_min_ms,
                lease_max_ms: self.lease_max_ms,
                max_lease_lifetime_ms: self.max_lease_lifetime_ms,
                max_deliveries: self.max_deliveries,
                backoff: Some(backoff),
                dedupe_window_ms: self.dedupe_window_ms,
                max_messages: self.max_messages,
                max_bytes: self.max_bytes,
                dead_letter_on_expiry: self.dead_letter_on_expiry,
            },
        )
    }

    fn from_fb(config: fb::QueueConfig<'_>) -> Result<Self, ProtoError> {
        let backoff = required(config.backoff(), "config.backoff")?;
        let kind = match backoff.kind() {
            fb::BackoffKind::Linear => BackoffKind::Linear,
            fb::BackoffKind::Exponential => BackoffKind::Exponential,
            other => {
                return Err(ProtoError::UnknownEnumValue {
                    field: "backoff.kind",
                    value: other.0.into(),
                })
            }
        };
        Ok(Self {
            partitions: config.partitions(),
            priority_bands: config.priority_bands(),
            lease_default_ms: config.lease_default_ms(),
            lease_min_ms: config.lease_min_ms(),
            lease_max_ms: config.lease_max_ms(),
            max_lease_lifetime_ms: config.max_lease_lifetime_ms(),
            max_deliveries: config.max_deliveries(),
            backoff: Backoff { kind, base_ms: backoff.base_ms(), cap_ms: backoff.cap_ms() },
            dedupe_window_ms: config.dedupe_window_ms(),
            max_messages: config.max_messages(),
            max_bytes: config.max_bytes(),
            dead_letter_on_expiry: config.dead_letter_on_expiry(),
        })
    }
}

// ------------------------------------------------------------ CreateQueue

/// Create a queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreateQueueRequest {
    /// Queue name.
    pub name: String,
    /// Its configuration.
    pub config: QueueConfig,
}

impl CreateQueueRequest {
    /// # Errors
    /// Invalid name or configuration.
    pub fn validate(&self) -> Result<(), ProtoError> {
        validate_queue_name(&self.name)?;
        self.config.validate()
    }

    pub(crate) fn write(&self, out: &mut Vec<u8>) {
        let mut builder = FlatBufferBuilder::new();
        let name = builder.create_string(&self.name);
        let config = self.config.build(&mut builder);
        let root = fb::CreateQueueRequest::create(
            &mut builder,
            &fb::CreateQueueRequestArgs { name: Some(name), config: Some(config) },
        );
        finish(builder, root, out);
    }

    pub(crate) fn read(body: &[u8]) -> Result<Self, ProtoError> {
        let table = root::<fb::CreateQueueRequest<'_>>(body)?;
        let request = Self {
            name: required(table.name(), "name")?.to_owned(),
            config: QueueConfig::from_fb(required(table.config(), "config")?)?,
        };
        request.validate()?;
        Ok(request)
    }
}

/// Result of a CreateQueue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CreateQueueResponse {
    /// The assignment table version that contains the new queue.
    pub assignment_version: AssignmentVersion,
}

scalar_response_codec!(
    CreateQueueResponse,
    CreateQueueResponseArgs,
    assignment_version: version_to_wire,
    AssignmentVersion
);

// ------------------------------------------------------------ DeleteQueue

/// Delete a queue and all its partitions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeleteQueueRequest {
    /// Queue name.
    pub name: String,
}

name_request_codec!(DeleteQueueRequest, DeleteQueueRequestArgs);

/// Result of a DeleteQueue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeleteQueueResponse {
    /// The assignment table version without the queue.
    pub assignment_version: AssignmentVersion,
}

scalar_response_codec!(
    DeleteQueueResponse,
    DeleteQueueResponseArgs,
    assignment_version: version_to_wire,
    AssignmentVersion
);

// ------------------------------------------------------------ ListQueues

/// List every queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ListQueuesRequest {}

impl ListQueuesRequest {
    pub(crate) fn write(&self, out: &mut Vec<u8>) {
        let mut builder = FlatBufferBuilder::new();
        let root = fb::ListQueuesRequest::create(&mut builder, &fb::ListQueuesRequestArgs {});
        finish(builder, root, out);
    }

    pub(crate) fn read(body: &[u8]) -> Result<Self, ProtoError> {
        root::<fb::ListQueuesRequest<'_>>(body)?;
        Ok(Self {})
    }
}

/// One queue in a listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueSummary {
    /// Queue name.
    pub name: String,
    /// Partition count.
    pub partitions: u32,
}

/// Result of a ListQueues.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ListQueuesResponse {
    /// At most `QUEUES_LISTED_MAX` queues.
    pub queues: Vec<QueueSummary>,
}

impl ListQueuesResponse {
    /// # Errors
    /// Too many queues, or an invalid name.
    pub fn validate(&self) -> Result<(), ProtoError> {
        check_len("queues", self.queues.len(), QUEUES_LISTED_MAX)?;
        self.queues.iter().try_for_each(|queue| validate_queue_name(&queue.name))
    }

    pub(crate) fn write(&self, out: &mut Vec<u8>) {
        let mut builder = FlatBufferBuilder::new();
        let queues: Vec<_> = self
            .queues
            .iter()
            .map(|queue| {
                let name = builder.create_string(&queue.name);
                fb::QueueSummary::create(
                    &mut builder,
                    &fb::QueueSummaryArgs { name: Some(name), partitions: queue.partitions },
                )
            })
            .collect();
        let queues = builder.create_vector(&queues);
        let root = fb::ListQueuesResponse::create(
            &mut builder,
            &fb::ListQueuesResponseArgs { queues: Some(queues) },
        );
        finish(builder, root, out);
    }

    pub(crate) fn read(body: &[u8]) -> Result<Self, ProtoError> {
        let table = root::<fb::ListQueuesResponse<'_>>(body)?;
        let vector = table.queues();
        vector_len(&vector, "queues", QUEUES_LISTED_MAX)?;
        let queues = vector
            .into_iter()
            .flatten()
            .map(|queue| {
                Ok(QueueSummary {
                    name: required(queue.name(), "queues.name")?.to_owned(),
                    partitions: queue.partitions(),
                })
            })
            .collect::<Result<_, ProtoError>>()?;
        let response = Self { queues };
        response.validate()?;
        Ok(response)
    }
}

// ------------------------------------------------------------ DescribeQueue

/// A queue's configuration and per-partition counts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DescribeQueueRequest {
    /// Queue name.
    pub name: String,
}

name_request_codec!(DescribeQueueRequest, DescribeQueueRequestArgs);

/// Message counts of one partition, by state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartitionStats {
    /// Which partition.
    pub partition: PartitionId,
    /// Claimable now.
    pub ready: u64,
    /// Waiting for a not_before.
    pub scheduled: u64,
    /// Leased.
    pub claimed: u64,
    /// Dead-lettered.
    pub quarantined: u64,
    /// Passed their expiry.
    pub expired: u64,
    /// Acked and not yet reclaimed by retention.
    pub acked: u64,
    /// Stored bytes.
    pub bytes: u64,
    /// Age of the oldest ready message (0 if none).
    pub oldest_ready_age_ms: u64,
    /// Deliveries given back with Release, ever (cumulative).
    pub released: u64,
    /// Leases that expired before an ack or release, ever (cumulative):
    /// each one makes the message claimable again (a redelivery).
    pub lease_expired: u64,
}

/// Result of a DescribeQueue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DescribeQueueResponse {
    /// Queue name.
    pub name: String,
    /// Its configuration.
    pub config: QueueConfig,
    /// One entry per partition.
    pub partitions: Vec<PartitionStats>,
}

impl DescribeQueueResponse {
    /// # Errors
    /// Invalid name, configuration or partition count.
    pub fn validate(&self) -> Result<(), ProtoError> {
        validate_queue_name(&self.name)?;
        self.config.validate()?;
        check_len("partitions", self.partitions.len(), PARTITIONS_MAX as usize)
    }

    pub(crate) fn write(&self, out: &mut Vec<u8>) {
        let mut builder = FlatBufferBuilder::new();
        let name = builder.create_string(&self.name);
        let config = self.config.build(&mut builder);
        let partitions: Vec<_> = self
            .partitions
            .iter()
            .map(|stats| {
                fb::PartitionStats::create(
                    &mut builder,
                    &fb::PartitionStatsArgs {
                        partition: stats.partition.0,
                        ready: stats.ready,
                        scheduled: stats.scheduled,
                        claimed: stats.claimed,
                        quarantined: stats.quarantined,
                        expired: stats.expired,
                        acked: stats.acked,
                        bytes: stats.bytes,
                        oldest_ready_age_ms: stats.oldest_ready_age_ms,
                        released: stats.released,
                        lease_expired: stats.lease_expired,
                    },
                )
            })
            .collect();
        let partitions = builder.create_vector(&partitions);
        let root = fb::DescribeQueueResponse::create(
            &mut builder,
            &fb::DescribeQueueResponseArgs {
                name: Some(name),
                config: Some(config),
                partitions: Some(partitions),
            },
        );
        finish(builder, root, out);
    }

    pub(crate) fn read(body: &[u8]) -> Result<Self, ProtoError> {
        let table = root::<fb::DescribeQueueResponse<'_>>(body)?;
        let vector = table.partitions();
        vector_len(&vector, "partitions", PARTITIONS_MAX as usize)?;
        let partitions = vector
            .into_iter()
            .flatten()
            .map(|stats| PartitionStats {
                partition: PartitionId(stats.partition()),
                ready: stats.ready(),
                scheduled: stats.scheduled(),
                claimed: stats.claimed(),
                quarantined: stats.quarantined(),
                expired: stats.expired(),
                acked: stats.acked(),
                bytes: stats.bytes(),
                oldest_ready_age_ms: stats.oldest_ready_age_ms(),
                released: stats.released(),
                lease_expired: stats.lease_expired(),
            })
            .collect();
        let response = Self {
            name: required(table.name(), "name")?.to_owned(),
            config: QueueConfig::from_fb(required(table.config(), "config")?)?,
            partitions,
        };
        response.validate()?;
        Ok(response)
    }
}

// ------------------------------------------------------------ Metadata

/// Where partitions live. An empty `queues` asks for every queue.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MetadataRequest {
    /// Queue names, at most `QUEUES_LISTED_MAX`.
    pub queues: Vec<String>,
}

impl MetadataRequest {
    /// # Errors
    /// Too many names, or an invalid name.
    pub fn validate(&self) -> Result<(), ProtoError> {
        check_len("queues", self.queues.len(), QUEUES_LISTED_MAX)?;
        self.queues.iter().try_for_each(|name| validate_queue_name(name))
    }

    pub(crate) fn write(&self, out: &mut Vec<u8>) {
        let mut builder = FlatBufferBuilder::new();
        let names: Vec<_> = self.queues.iter().map(|name| builder.create_string(name)).collect();
        let queues = builder.create_vector(&names);
        let root = fb::MetadataRequest::create(
            &mut builder,
            &fb::MetadataRequestArgs { queues: Some(queues) },
        );
        finish(builder, root, out);
    }

    pub(crate) fn read(body: &[u8]) -> Result<Self, ProtoError> {
        let table = root::<fb::MetadataRequest<'_>>(body)?;
        let vector = table.queues();
        vector_len(&vector, "queues", QUEUES_LISTED_MAX)?;
        let queues = vector.into_iter().flatten().map(str::to_owned).collect();
        let request = Self { queues };
        request.validate()?;
        Ok(request)
    }
}

/// Where one partition lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionMetadata {
    /// Which partition.
    pub partition: PartitionId,
    /// The owning node's host (name or IP literal).
    pub host: String,
    /// The owning shard's port on that host.
    pub shard_port: u16,
    /// The partition's current leader epoch.
    pub leader_epoch: LeaderEpoch,
}

/// Placement of one queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueMetadata {
    /// Queue name.
    pub name: String,
    /// One entry per partition.
    pub partitions: Vec<PartitionMetadata>,
}

/// Result of a Metadata request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetadataResponse {
    /// The assignment table version this answer reflects.
    pub assignment_version: AssignmentVersion,
    /// Requested queues that exist.
    pub queues: Vec<QueueMetadata>,
}

impl MetadataResponse {
    /// # Errors
    /// Too many queues or partitions, invalid names or hosts.
    pub fn validate(&self) -> Result<(), ProtoError> {
        check_len("queues", self.queues.len(), QUEUES_LISTED_MAX)?;
        for queue in &self.queues {
            validate_queue_name(&queue.name)?;
            check_len("partitions", queue.partitions.len(), PARTITIONS_MAX as usize)?;
            for partition in &queue.partitions {
                check_range("host length", partition.host.len() as u64, 1, HOST_BYTES_MAX as u64)?;
            }
        }
        Ok(())
    }

    pub(crate) fn write(&self, out: &mut Vec<u8>) {
        let mut builder = FlatBufferBuilder::new();
        let queues: Vec<_> = self
            .queues
            .iter()
            .map(|queue| {
                let partitions: Vec<_> = queue
                    .partitions
                    .iter()
                    .map(|partition| {
                        let host = builder.create_string(&partition.host);
                        fb::PartitionMetadata::create(
                            &mut builder,
                            &fb::PartitionMetadataArgs {
                                partition: partition.partition.0,
                                host: Some(host),
                                shard_port: partition.shard_port,
                                leader_epoch: partition.leader_epoch.0,
                            },
                        )
                    })
                    .collect();
                let partitions = builder.create_vector(&partitions);
                let name = builder.create_string(&queue.name);
                fb::QueueMetadata::create(
                    &mut builder,
                    &fb::QueueMetadataArgs { name: Some(name), partitions: Some(partitions) },
                )
            })
            .collect();
        let queues = builder.create_vector(&queues);
        let root = fb::MetadataResponse::create(
            &mut builder,
            &fb::MetadataResponseArgs {
                assignment_version: self.assignment_version.0,
                queues: Some(queues),
            },
        );
        finish(builder, root, out);
    }

    pub(crate) fn read(body: &[u8]) -> Result<Self, ProtoError> {
        let table = root::<fb::MetadataResponse<'_>>(body)?;
        let vector = table.queues();
        vector_len(&vector, "queues", QUEUES_LISTED_MAX)?;
        let mut queues = Vec::with_capacity(vector.as_ref().map_or(0, |vector| vector.len()));
        for queue in vector.into_iter().flatten() {
            let partitions_vector = queue.partitions();
            vector_len(&partitions_vector, "partitions", PARTITIONS_MAX as usize)?;
            let partitions = partitions_vector
                .into_iter()
                .flatten()
                .map(|partition| {
                    Ok(PartitionMetadata {
                        partition: PartitionId(partition.partition()),
                        host: required(partition.host(), "partitions.host")?.to_owned(),
                        shard_port: partition.shard_port(),
                        leader_epoch: LeaderEpoch(partition.leader_epoch()),
                    })
                })
                .collect::<Result<_, ProtoError>>()?;
            queues.push(QueueMetadata {
                name: required(queue.name(), "queues.name")?.to_owned(),
                partitions,
            });
        }
        let response =
            Self { assignment_version: AssignmentVersion(table.assignment_version()), queues };
        response.validate()?;
        Ok(response)
    }
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
}

impl PurgeRequest {
    /// # Errors
    /// Invalid name.
    pub fn validate(&self) -> Result<(), ProtoError> {
        validate_queue_name(&self.queue)
    }

    pub(crate) fn write(&self, out: &mut Vec<u8>) {
        let mut builder = FlatBufferBuilder::new();
        let queue = builder.create_string(&self.queue);
        let root = fb::PurgeRequest::create(
            &mut builder,
            &fb::PurgeRequestArgs {
                queue: Some(queue),
                partition: self.partition.0,
                dry_run: self.dry_run,
            },
        );
        finish(builder, root, out);
    }

    pub(crate) fn read(body: &[u8]) -> Result<Self, ProtoError> {
        let table = root::<fb::PurgeRequest<'_>>(body)?;
        let request = Self {
            queue: required(table.queue(), "queue")?.to_owned(),
            partition: PartitionId(table.partition()),
            dry_run: table.dry_run(),
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
}

impl RedriveRequest {
    /// # Errors
    /// Invalid name, or an offset list empty or too long.
    pub fn validate(&self) -> Result<(), ProtoError> {
        validate_queue_name(&self.queue)?;
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
        let root = fb::RedriveRequest::create(
            &mut builder,
            &fb::RedriveRequestArgs {
                queue: Some(queue),
                partition: self.partition.0,
                all,
                offsets,
            },
        );
        finish(builder, root, out);
    }

    pub(crate) fn read(body: &[u8]) -> Result<Self, ProtoError> {
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
