//! Queue administration messages: a queue's configuration ([`QueueConfig`],
//! its [`Backoff`]) and CreateQueue, DeleteQueue, ListQueues and
//! DescribeQueue with their responses (per-partition counts included; from
//! DescribeQueue v2 the subscriptions' counts, `subscriptions.rs`).
//!
//! Owns these structs, their `validate` and their flatbuffers layout. It
//! must not decide anything a broker decides (whether a queue exists, which
//! shard leads a partition) nor check more than absolute ranges and the
//! order of the lease bounds: a queue's own limits are the broker's.

use flatbuffers::{FlatBufferBuilder, WIPOffset};

use super::subscriptions::{build_stats, read_stats, validate_stats, SubscriptionStats};
use super::{finish, required, root, vector_len};
use crate::limits::PRIORITY_BANDS_MAX;
use crate::limits::ROUTING_KEY_BYTES_MAX;
use crate::proto::codec::{check_len, check_range, validate_queue_name};
use crate::proto::control_generated::spool::control as fb;
use crate::proto::error::ProtoError;
use crate::proto::frame::{
    CREATE_QUEUE_VERSION_ORDERED, CREATE_QUEUE_VERSION_RETENTION,
    DESCRIBE_QUEUE_VERSION_SUBSCRIPTIONS,
};
use crate::proto::ids::{AssignmentVersion, PartitionId};
use crate::proto::limits::{
    BACKOFF_CAP_MS_MAX, DEDUPE_WINDOW_MS_MAX, LEASE_LIFETIME_MS_MAX, LEASE_MS_MAX, LEASE_MS_MIN,
    MAX_DELIVERIES_MAX, PARTITIONS_MAX, QUEUES_LISTED_MAX, RETENTION_BYTES_MIN, RETENTION_MS_MAX,
    RETENTION_MS_MIN,
};

fn version_to_wire(version: AssignmentVersion) -> u64 {
    version.0
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
    /// Retention window by time (`docs/design/subscriptions.md` §5): a
    /// record stays replayable this long after its enqueue, whether or not
    /// every subscription finished it, and leaves then even if one had not
    /// (that subscription *lost* it). 0 (no window by time) or
    /// `RETENTION_MS_MIN..=RETENTION_MS_MAX`. Needs CreateQueue
    /// [`CREATE_QUEUE_VERSION_RETENTION`].
    pub retention_ms: u64,
    /// Retention window by size: the oldest records leave while the
    /// retained ones exceed this many bytes. 0 (no window by size) or at
    /// least `RETENTION_BYTES_MIN`; the broker also wants it at most
    /// `max_bytes`. Needs CreateQueue [`CREATE_QUEUE_VERSION_RETENTION`].
    pub retention_bytes: u64,
    /// Ordered lanes (`docs/design/ordered-lanes.md`): per routing key at
    /// most one message at a time, in offset order; messages without a key
    /// are unordered. The broker refuses it with a retention window (for
    /// now). Needs CreateQueue [`CREATE_QUEUE_VERSION_ORDERED`].
    pub ordered: bool,
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
        check_range("max_bytes", self.max_bytes, 1, u64::MAX)?;
        if self.retention_ms != 0 {
            check_range("retention_ms", self.retention_ms, RETENTION_MS_MIN, RETENTION_MS_MAX)?;
        }
        if self.retention_bytes != 0 {
            check_range("retention_bytes", self.retention_bytes, RETENTION_BYTES_MIN, u64::MAX)?;
        }
        Ok(())
    }

    /// Whether the queue keeps records for replay by a retention window
    /// (time or size) rather than until every subscription finished them.
    pub fn has_window(&self) -> bool {
        self.retention_ms != 0 || self.retention_bytes != 0
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
                retention_ms: self.retention_ms,
                retention_bytes: self.retention_bytes,
                ordered: self.ordered,
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
            retention_ms: config.retention_ms(),
            retention_bytes: config.retention_bytes(),
            ordered: config.ordered(),
        })
    }
}

// ------------------------------------------------------------ CreateQueue

/// Create a queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreateQueueRequest {
    /// Queue name.
    pub name: String,
    /// Its configuration. A retention window
    /// ([`QueueConfig::has_window`]) goes only in version
    /// [`CREATE_QUEUE_VERSION_RETENTION`] or later: a broker that predates
    /// windows refuses that version (`UNSUPPORTED_VERSION`) instead of
    /// creating the queue without its window; `ordered` likewise only in
    /// [`CREATE_QUEUE_VERSION_ORDERED`] or later.
    pub config: QueueConfig,
}

impl CreateQueueRequest {
    /// # Errors
    /// Invalid name or configuration.
    pub fn validate(&self) -> Result<(), ProtoError> {
        validate_queue_name(&self.name)?;
        self.config.validate()
    }

    /// Refuses a retention window in a version before
    /// [`CREATE_QUEUE_VERSION_RETENTION`] and `ordered` before
    /// [`CREATE_QUEUE_VERSION_ORDERED`] (the encoder's check: such a
    /// request would reach the broker as one for a queue without a window,
    /// or an unordered one).
    ///
    /// # Errors
    /// [`ProtoError::Inconsistent`].
    pub fn validate_version(&self, version: u16) -> Result<(), ProtoError> {
        if self.config.has_window() && version < CREATE_QUEUE_VERSION_RETENTION {
            return Err(ProtoError::Inconsistent(
                "a CreateQueue with a retention window needs version 2",
            ));
        }
        if self.config.ordered && version < CREATE_QUEUE_VERSION_ORDERED {
            return Err(ProtoError::Inconsistent(
                "a CreateQueue of an ordered queue needs version 3",
            ));
        }
        Ok(())
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

    /// Reads `version` of CreateQueue: before
    /// [`CREATE_QUEUE_VERSION_RETENTION`] the window reads as none,
    /// whatever the bytes hold (as a broker of that version reads it), and
    /// before [`CREATE_QUEUE_VERSION_ORDERED`] the queue reads as unordered.
    pub(crate) fn read(body: &[u8], version: u16) -> Result<Self, ProtoError> {
        let table = root::<fb::CreateQueueRequest<'_>>(body)?;
        let mut config = QueueConfig::from_fb(required(table.config(), "config")?)?;
        if version < CREATE_QUEUE_VERSION_RETENTION {
            config.retention_ms = 0;
            config.retention_bytes = 0;
        }
        if version < CREATE_QUEUE_VERSION_ORDERED {
            config.ordered = false;
        }
        let request = Self { name: required(table.name(), "name")?.to_owned(), config };
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
#[derive(Debug, Clone, PartialEq, Eq)]
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
    /// A replicated partition's replication, as its leader reports it;
    /// `None` on a single node (and from a broker that predates it).
    pub replication: Option<PartitionReplication>,
    /// What the partition keeps for replay: the records of its shared
    /// index (those a subscription started at the earliest record now
    /// would be given; with a retention window also those every
    /// subscription finished), their bytes, and the age of the oldest (0:
    /// none). All 0 from a broker that predates retention windows.
    pub retained: RetainedStats,
    /// An ordered queue's lanes in this partition (all 0 and empty for an
    /// unordered queue, and from a broker that predates ordered lanes).
    pub lanes: LaneStats,
}

/// An ordered queue's lanes in one partition
/// (`docs/design/ordered-lanes.md`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LaneStats {
    /// Routing keys with a message here (each heads a lane).
    pub active_keys: u64,
    /// Keys with a message waiting behind their lane's head.
    pub blocked_keys: u64,
    /// Messages waiting behind a head.
    pub waiting: u64,
    /// Age of the oldest waiting message (0: none).
    pub oldest_waiting_age_ms: u64,
    /// The routing key of that message, the key blocked longest (empty:
    /// none, or its record could not be read); at most
    /// `ROUTING_KEY_BYTES_MAX` bytes.
    pub blocked_longest_key: Vec<u8>,
}

impl LaneStats {
    /// Adds another partition's lanes: counts summed, the oldest age and
    /// its key kept.
    pub fn merge(&mut self, other: &Self) {
        self.active_keys = self.active_keys.saturating_add(other.active_keys);
        self.blocked_keys = self.blocked_keys.saturating_add(other.blocked_keys);
        if other.waiting > 0
            && (self.waiting == 0 || other.oldest_waiting_age_ms > self.oldest_waiting_age_ms)
        {
            self.oldest_waiting_age_ms = other.oldest_waiting_age_ms;
            self.blocked_longest_key.clone_from(&other.blocked_longest_key);
        }
        self.waiting = self.waiting.saturating_add(other.waiting);
    }
}

/// What a partition keeps for replay (its shared index).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RetainedStats {
    /// Records.
    pub messages: u64,
    /// Their record bytes.
    pub bytes: u64,
    /// Age of the oldest (0: none).
    pub oldest_age_ms: u64,
}

/// Replication of one partition, as its leader sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartitionReplication {
    /// The leader's node id (never 0).
    pub leader_node: u64,
    /// Its term: the partition's leader epoch.
    pub term: u64,
    /// The highest log index a majority holds.
    pub committed_index: u64,
    /// Committed entries the member furthest behind still lacks (0: every
    /// member holds every committed entry).
    pub lag_entries: u64,
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
    /// The queue's key map: its version (1 at creation, + 1 per resize; 0
    /// from a broker that predates resizes), the partitions still draining
    /// the records they took before the last resize, and the first
    /// partition that resize added: partitions from it on hand out nothing
    /// while `draining` is not empty.
    pub keys: KeyMapStats,
    /// Every subscription of the queue, the default first, with its
    /// counters over the partitions this answer reports. Carried from
    /// version 2 ([`DESCRIBE_QUEUE_VERSION_SUBSCRIPTIONS`]): an answer in
    /// an older version leaves it out, and reads as empty.
    pub subscriptions: Vec<SubscriptionStats>,
}

/// A queue's key map as DescribeQueue reports it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct KeyMapStats {
    /// 1 at creation, + 1 per resize.
    pub version: u64,
    /// Older partitions still finishing the records they took before the
    /// last resize (empty: no partition is held).
    pub draining: Vec<PartitionId>,
    /// The first partition the last resize added (the partition count when
    /// the queue never grew).
    pub held_from: u32,
}

impl DescribeQueueResponse {
    /// # Errors
    /// Invalid name, configuration or partition count.
    pub fn validate(&self) -> Result<(), ProtoError> {
        validate_queue_name(&self.name)?;
        self.config.validate()?;
        check_len("partitions", self.partitions.len(), PARTITIONS_MAX as usize)?;
        check_len("draining", self.keys.draining.len(), PARTITIONS_MAX as usize)?;
        for stats in &self.partitions {
            check_len(
                "lane_blocked_longest_key",
                stats.lanes.blocked_longest_key.len(),
                ROUTING_KEY_BYTES_MAX,
            )?;
        }
        validate_stats(&self.subscriptions)
    }

    /// Writes the answer as `version` of DescribeQueue: the subscriptions
    /// only from [`DESCRIBE_QUEUE_VERSION_SUBSCRIPTIONS`] on, so an older
    /// client gets the bytes it always got.
    pub(crate) fn write(&self, out: &mut Vec<u8>, version: u16) {
        let mut builder = FlatBufferBuilder::new();
        let name = builder.create_string(&self.name);
        let config = self.config.build(&mut builder);
        let partitions: Vec<_> = self
            .partitions
            .iter()
            .map(|stats| {
                let blocked_key = (!stats.lanes.blocked_longest_key.is_empty())
                    .then(|| builder.create_vector(&stats.lanes.blocked_longest_key));
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
                        leader_node: stats.replication.map_or(0, |r| r.leader_node),
                        term: stats.replication.map_or(0, |r| r.term),
                        committed_index: stats.replication.map_or(0, |r| r.committed_index),
                        lag_entries: stats.replication.map_or(0, |r| r.lag_entries),
                        retained_messages: stats.retained.messages,
                        retained_bytes: stats.retained.bytes,
                        oldest_retained_age_ms: stats.retained.oldest_age_ms,
                        lane_active_keys: stats.lanes.active_keys,
                        lane_blocked_keys: stats.lanes.blocked_keys,
                        lane_waiting: stats.lanes.waiting,
                        lane_oldest_waiting_age_ms: stats.lanes.oldest_waiting_age_ms,
                        lane_blocked_longest_key: blocked_key,
                    },
                )
            })
            .collect();
        let partitions = builder.create_vector(&partitions);
        let draining: Vec<u32> = self.keys.draining.iter().map(|partition| partition.0).collect();
        let draining = builder.create_vector(&draining);
        let subscriptions = (version >= DESCRIBE_QUEUE_VERSION_SUBSCRIPTIONS)
            .then(|| build_stats(&mut builder, &self.subscriptions));
        let root = fb::DescribeQueueResponse::create(
            &mut builder,
            &fb::DescribeQueueResponseArgs {
                name: Some(name),
                config: Some(config),
                partitions: Some(partitions),
                key_version: self.keys.version,
                draining: Some(draining),
                held_from: self.keys.held_from,
                subscriptions,
            },
        );
        finish(builder, root, out);
    }

    /// Reads an answer in `version` of DescribeQueue (the subscriptions
    /// only from [`DESCRIBE_QUEUE_VERSION_SUBSCRIPTIONS`] on).
    pub(crate) fn read(body: &[u8], version: u16) -> Result<Self, ProtoError> {
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
                // Leader node 0: not replicated (a single node, or a
                // broker from before these fields).
                replication: (stats.leader_node() != 0).then(|| PartitionReplication {
                    leader_node: stats.leader_node(),
                    term: stats.term(),
                    committed_index: stats.committed_index(),
                    lag_entries: stats.lag_entries(),
                }),
                retained: RetainedStats {
                    messages: stats.retained_messages(),
                    bytes: stats.retained_bytes(),
                    oldest_age_ms: stats.oldest_retained_age_ms(),
                },
                lanes: LaneStats {
                    active_keys: stats.lane_active_keys(),
                    blocked_keys: stats.lane_blocked_keys(),
                    waiting: stats.lane_waiting(),
                    oldest_waiting_age_ms: stats.lane_oldest_waiting_age_ms(),
                    blocked_longest_key: stats
                        .lane_blocked_longest_key()
                        .map(|key| key.bytes().to_vec())
                        .unwrap_or_default(),
                },
            })
            .collect();
        let response = Self {
            name: required(table.name(), "name")?.to_owned(),
            config: QueueConfig::from_fb(required(table.config(), "config")?)?,
            partitions,
            keys: KeyMapStats {
                version: table.key_version(),
                draining: table
                    .draining()
                    .map(|draining| draining.iter().map(PartitionId).collect())
                    .unwrap_or_default(),
                held_from: table.held_from(),
            },
            subscriptions: if version >= DESCRIBE_QUEUE_VERSION_SUBSCRIPTIONS {
                read_stats(table.subscriptions())?
            } else {
                Vec::new()
            },
        };
        response.validate()?;
        Ok(response)
    }
}
