//! The ResizeQueue message: grow a queue to more partitions. The broker
//! adds the partitions, gives the queue's key map a new version and holds
//! the new partitions' messages until every older partition has finished
//! the records it took before the resize (`docs/design/protocol.md`,
//! "Key routing").
//!
//! Owns the request and response structs, their `validate` and their
//! flatbuffers layout; whether a resize fits the queue is the broker's.

use flatbuffers::FlatBufferBuilder;

use super::{finish, required, root};
use crate::proto::codec::{check_range, validate_queue_name};
use crate::proto::control_generated::spool::control as fb;
use crate::proto::error::ProtoError;
use crate::proto::ids::AssignmentVersion;
use crate::proto::limits::PARTITIONS_MAX;

/// Grow queue `name` to `partitions` partitions (more than it has).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResizeQueueRequest {
    /// Queue name.
    pub name: String,
    /// The partition count after the resize, `2..=PARTITIONS_MAX`.
    pub partitions: u32,
}

impl ResizeQueueRequest {
    /// # Errors
    /// Invalid name, or a count outside `2..=PARTITIONS_MAX`.
    pub fn validate(&self) -> Result<(), ProtoError> {
        validate_queue_name(&self.name)?;
        check_range("partitions", u64::from(self.partitions), 2, u64::from(PARTITIONS_MAX))
    }

    pub(crate) fn write(&self, out: &mut Vec<u8>) {
        let mut builder = FlatBufferBuilder::new();
        let name = builder.create_string(&self.name);
        let root = fb::ResizeQueueRequest::create(
            &mut builder,
            &fb::ResizeQueueRequestArgs { name: Some(name), partitions: self.partitions },
        );
        finish(builder, root, out);
    }

    pub(crate) fn read(body: &[u8]) -> Result<Self, ProtoError> {
        let table = root::<fb::ResizeQueueRequest<'_>>(body)?;
        let request = Self {
            name: required(table.name(), "name")?.to_owned(),
            partitions: table.partitions(),
        };
        request.validate()?;
        Ok(request)
    }
}

/// Result of a ResizeQueue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResizeQueueResponse {
    /// The assignment table version that holds the new partitions.
    pub assignment_version: AssignmentVersion,
    /// The queue's key map version after the resize.
    pub key_version: u64,
}

impl ResizeQueueResponse {
    pub(crate) fn write(&self, out: &mut Vec<u8>) {
        let mut builder = FlatBufferBuilder::new();
        let root = fb::ResizeQueueResponse::create(
            &mut builder,
            &fb::ResizeQueueResponseArgs {
                assignment_version: self.assignment_version.0,
                key_version: self.key_version,
            },
        );
        finish(builder, root, out);
    }

    pub(crate) fn read(body: &[u8]) -> Result<Self, ProtoError> {
        let table = root::<fb::ResizeQueueResponse<'_>>(body)?;
        Ok(Self {
            assignment_version: AssignmentVersion(table.assignment_version()),
            key_version: table.key_version(),
        })
    }
}
