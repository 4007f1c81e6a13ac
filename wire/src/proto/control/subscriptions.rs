//! A queue's subscriptions over the wire (`docs/design/subscriptions.md`):
//! CreateSubscription and DeleteSubscription (key 26 and 27, version 0) with
//! their responses, and [`SubscriptionStats`], the entries DescribeQueue
//! lists from version 2 ([`DESCRIBE_QUEUE_VERSION_SUBSCRIPTIONS`]).
//!
//! Owns these structs, their `validate` and their flatbuffers layout.
//! Whether a subscription exists, whether a queue may have another, and
//! that `default` is neither created nor deleted are the broker's to
//! decide; the codec checks names and list lengths.
//!
//! [`DESCRIBE_QUEUE_VERSION_SUBSCRIPTIONS`]: crate::proto::DESCRIBE_QUEUE_VERSION_SUBSCRIPTIONS

use flatbuffers::{FlatBufferBuilder, Vector, WIPOffset};

use super::{finish, required, root, vector_len};
use crate::proto::codec::{check_len, validate_queue_name, validate_subscription_name};
use crate::proto::control_generated::spool::control as fb;
use crate::proto::error::ProtoError;
use crate::proto::ids::AssignmentVersion;
use crate::proto::limits::SUBSCRIPTIONS_PER_QUEUE_MAX;

/// Where a new subscription starts on each partition of its queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SubscriptionStart {
    /// Only records enqueued after the partition started it (the default,
    /// as the admin API's).
    #[default]
    Latest,
    /// Every record the partition still has to deliver to some
    /// subscription.
    Earliest,
    /// The records enqueued at or after this time (Unix ms) that the
    /// partition still has; none that recent: as `Latest`.
    Time(u64),
    /// The records at or above this offset, in every partition, that the
    /// partition still has; past its end: as `Latest`.
    Offset(u64),
}

impl SubscriptionStart {
    /// The flatbuffers enum and the table's `start_at`.
    fn to_fb(self) -> (fb::SubscriptionStart, u64) {
        match self {
            Self::Latest => (fb::SubscriptionStart::Latest, 0),
            Self::Earliest => (fb::SubscriptionStart::Earliest, 0),
            Self::Time(time_ms) => (fb::SubscriptionStart::Time, time_ms),
            Self::Offset(offset) => (fb::SubscriptionStart::Offset, offset),
        }
    }

    fn from_fb(
        start: fb::SubscriptionStart,
        at: u64,
        field: &'static str,
    ) -> Result<Self, ProtoError> {
        match start {
            fb::SubscriptionStart::Latest => Ok(Self::Latest),
            fb::SubscriptionStart::Earliest => Ok(Self::Earliest),
            fb::SubscriptionStart::Time => Ok(Self::Time(at)),
            fb::SubscriptionStart::Offset => Ok(Self::Offset(at)),
            other => Err(ProtoError::UnknownEnumValue { field, value: other.0.into() }),
        }
    }
}

// ------------------------------------------------------------ CreateSubscription

/// Add subscription `name` to `queue`, starting at `start`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreateSubscriptionRequest {
    /// Queue name.
    pub queue: String,
    /// The new subscription's name: the queue names' rule
    /// ([`validate_subscription_name`]); `default` is the broker's to
    /// refuse.
    pub name: String,
    /// Where it starts on each partition.
    pub start: SubscriptionStart,
}

impl CreateSubscriptionRequest {
    /// # Errors
    /// Invalid queue or subscription name.
    pub fn validate(&self) -> Result<(), ProtoError> {
        validate_queue_name(&self.queue)?;
        validate_subscription_name(&self.name)
    }

    pub(crate) fn write(&self, out: &mut Vec<u8>) {
        let mut builder = FlatBufferBuilder::new();
        let queue = builder.create_string(&self.queue);
        let name = builder.create_string(&self.name);
        let (start, start_at) = self.start.to_fb();
        let root = fb::CreateSubscriptionRequest::create(
            &mut builder,
            &fb::CreateSubscriptionRequestArgs {
                queue: Some(queue),
                name: Some(name),
                start,
                start_at,
            },
        );
        finish(builder, root, out);
    }

    pub(crate) fn read(body: &[u8]) -> Result<Self, ProtoError> {
        let table = root::<fb::CreateSubscriptionRequest<'_>>(body)?;
        let request = Self {
            queue: required(table.queue(), "queue")?.to_owned(),
            name: required(table.name(), "name")?.to_owned(),
            start: SubscriptionStart::from_fb(table.start(), table.start_at(), "start")?,
        };
        request.validate()?;
        Ok(request)
    }
}

/// Result of a CreateSubscription.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CreateSubscriptionResponse {
    /// The assignment table version that holds the subscription.
    pub assignment_version: AssignmentVersion,
    /// Its id within the queue (never 0, the default's; never reused).
    pub id: u16,
}

impl CreateSubscriptionResponse {
    pub(crate) fn write(&self, out: &mut Vec<u8>) {
        let mut builder = FlatBufferBuilder::new();
        let root = fb::CreateSubscriptionResponse::create(
            &mut builder,
            &fb::CreateSubscriptionResponseArgs {
                assignment_version: self.assignment_version.0,
                id: self.id,
            },
        );
        finish(builder, root, out);
    }

    pub(crate) fn read(body: &[u8]) -> Result<Self, ProtoError> {
        let table = root::<fb::CreateSubscriptionResponse<'_>>(body)?;
        Ok(Self {
            assignment_version: AssignmentVersion(table.assignment_version()),
            id: table.id(),
        })
    }
}

// ------------------------------------------------------------ DeleteSubscription

/// Delete subscription `name` of `queue`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeleteSubscriptionRequest {
    /// Queue name.
    pub queue: String,
    /// The subscription's name.
    pub name: String,
}

impl DeleteSubscriptionRequest {
    /// # Errors
    /// Invalid queue or subscription name.
    pub fn validate(&self) -> Result<(), ProtoError> {
        validate_queue_name(&self.queue)?;
        validate_subscription_name(&self.name)
    }

    pub(crate) fn write(&self, out: &mut Vec<u8>) {
        let mut builder = FlatBufferBuilder::new();
        let queue = builder.create_string(&self.queue);
        let name = builder.create_string(&self.name);
        let root = fb::DeleteSubscriptionRequest::create(
            &mut builder,
            &fb::DeleteSubscriptionRequestArgs { queue: Some(queue), name: Some(name) },
        );
        finish(builder, root, out);
    }

    pub(crate) fn read(body: &[u8]) -> Result<Self, ProtoError> {
        let table = root::<fb::DeleteSubscriptionRequest<'_>>(body)?;
        let request = Self {
            queue: required(table.queue(), "queue")?.to_owned(),
            name: required(table.name(), "name")?.to_owned(),
        };
        request.validate()?;
        Ok(request)
    }
}

/// Result of a DeleteSubscription.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeleteSubscriptionResponse {
    /// The assignment table version without the subscription.
    pub assignment_version: AssignmentVersion,
}

fn version_to_wire(version: AssignmentVersion) -> u64 {
    version.0
}

scalar_response_codec!(
    DeleteSubscriptionResponse,
    DeleteSubscriptionResponseArgs,
    assignment_version: version_to_wire,
    AssignmentVersion
);

// ------------------------------------------------------------ DescribeQueue v2

/// One subscription of a queue as DescribeQueue lists it (version 2 on):
/// its counters summed over the partitions the answer covers, the ages
/// the largest of theirs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubscriptionStats {
    /// Its name (`default` for the default).
    pub name: String,
    /// Its id within the queue (0: the default).
    pub id: u16,
    /// Where it started (the default reads as
    /// [`SubscriptionStart::Earliest`]: it holds every record from the
    /// queue's creation).
    pub start: SubscriptionStart,
    /// Partitions whose counters are summed here: those the answering
    /// shard reports that have started the subscription (one that has not
    /// yet is not counted).
    pub partitions: u32,
    /// Claimable now.
    pub ready: u64,
    /// Waiting for a not_before or a release's backoff.
    pub scheduled: u64,
    /// Under a lease (in flight).
    pub claimed: u64,
    /// Dead-lettered in this subscription.
    pub dead_letters: u64,
    /// Age of the oldest ready message (0: none).
    pub oldest_ready_age_ms: u64,
    /// Age of the oldest claim still held: the oldest unacked delivery (0:
    /// none).
    pub oldest_claim_age_ms: u64,
    /// Acks in this subscription, ever (cumulative).
    pub acked: u64,
    /// Records the queue's retention window dropped before this
    /// subscription delivered them, ever (cumulative; 0 without a window,
    /// and from a broker that predates windows).
    pub lost: u64,
}

impl SubscriptionStats {
    /// Adds `other`'s counters (another shard's share of the same
    /// subscription): sums, and the larger of the ages.
    pub fn merge(&mut self, other: &SubscriptionStats) {
        self.partitions = self.partitions.saturating_add(other.partitions);
        self.ready = self.ready.saturating_add(other.ready);
        self.scheduled = self.scheduled.saturating_add(other.scheduled);
        self.claimed = self.claimed.saturating_add(other.claimed);
        self.dead_letters = self.dead_letters.saturating_add(other.dead_letters);
        self.oldest_ready_age_ms = self.oldest_ready_age_ms.max(other.oldest_ready_age_ms);
        self.oldest_claim_age_ms = self.oldest_claim_age_ms.max(other.oldest_claim_age_ms);
        self.acked = self.acked.saturating_add(other.acked);
        self.lost = self.lost.saturating_add(other.lost);
    }
}

/// Checks a DescribeQueue answer's subscription list.
pub(super) fn validate_stats(subscriptions: &[SubscriptionStats]) -> Result<(), ProtoError> {
    check_len("subscriptions", subscriptions.len(), SUBSCRIPTIONS_PER_QUEUE_MAX)?;
    subscriptions.iter().try_for_each(|stats| validate_subscription_name(&stats.name))
}

/// Builds the subscription list of a DescribeQueue answer.
pub(super) fn build_stats<'b>(
    builder: &mut FlatBufferBuilder<'b>,
    subscriptions: &[SubscriptionStats],
) -> WIPOffset<Vector<'b, flatbuffers::ForwardsUOffset<fb::SubscriptionStats<'b>>>> {
    let built: Vec<_> = subscriptions
        .iter()
        .map(|stats| {
            let name = builder.create_string(&stats.name);
            let (start, start_at) = stats.start.to_fb();
            fb::SubscriptionStats::create(
                builder,
                &fb::SubscriptionStatsArgs {
                    name: Some(name),
                    id: stats.id,
                    start,
                    start_at,
                    partitions: stats.partitions,
                    ready: stats.ready,
                    scheduled: stats.scheduled,
                    claimed: stats.claimed,
                    dead_letters: stats.dead_letters,
                    oldest_ready_age_ms: stats.oldest_ready_age_ms,
                    oldest_claim_age_ms: stats.oldest_claim_age_ms,
                    acked: stats.acked,
                    lost: stats.lost,
                },
            )
        })
        .collect();
    builder.create_vector(&built)
}

/// Reads the subscription list of a DescribeQueue answer (absent: empty).
pub(super) fn read_stats(
    vector: Option<Vector<'_, flatbuffers::ForwardsUOffset<fb::SubscriptionStats<'_>>>>,
) -> Result<Vec<SubscriptionStats>, ProtoError> {
    vector_len(&vector, "subscriptions", SUBSCRIPTIONS_PER_QUEUE_MAX)?;
    vector
        .into_iter()
        .flatten()
        .map(|stats| {
            Ok(SubscriptionStats {
                name: required(stats.name(), "subscriptions.name")?.to_owned(),
                id: stats.id(),
                start: SubscriptionStart::from_fb(
                    stats.start(),
                    stats.start_at(),
                    "subscriptions.start",
                )?,
                partitions: stats.partitions(),
                ready: stats.ready(),
                scheduled: stats.scheduled(),
                claimed: stats.claimed(),
                dead_letters: stats.dead_letters(),
                oldest_ready_age_ms: stats.oldest_ready_age_ms(),
                oldest_claim_age_ms: stats.oldest_claim_age_ms(),
                acked: stats.acked(),
                lost: stats.lost(),
            })
        })
        .collect()
}
