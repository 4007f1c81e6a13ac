//! The Metadata message: which host and shard port lead each partition of
//! the queues asked for, with the partition's leader epoch and the
//! assignment table version the answer reflects. Clients route every data
//! request by it.
//!
//! Owns the request and response structs, their `validate` and their
//! flatbuffers layout. It must not route, cache or compare versions: that
//! is the client's (routing) and the broker's (the assignment table).

use flatbuffers::FlatBufferBuilder;

use super::{finish, required, root, vector_len};
use crate::proto::codec::{check_len, check_range, validate_queue_name};
use crate::proto::control_generated::spool::control as fb;
use crate::proto::error::ProtoError;
use crate::proto::ids::{AssignmentVersion, LeaderEpoch, PartitionId};
use crate::proto::limits::{HOST_BYTES_MAX, PARTITIONS_MAX, QUEUES_LISTED_MAX};

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
    /// The queue's key map version: 1 at creation, + 1 per resize (0 from
    /// a broker that predates resizes). A client that routed keys by an
    /// older version routes its unsent messages again.
    pub key_version: u64,
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
                    &fb::QueueMetadataArgs {
                        name: Some(name),
                        partitions: Some(partitions),
                        key_version: queue.key_version,
                    },
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
                key_version: queue.key_version(),
            });
        }
        let response =
            Self { assignment_version: AssignmentVersion(table.assignment_version()), queues };
        response.validate()?;
        Ok(response)
    }
}
