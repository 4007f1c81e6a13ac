//! What a shard tells the admin port when asked: its partitions' counters,
//! the partitions it refused, its log and disk figures.
//!
//! A report is plain data (`Send`), built on the shard's own thread from
//! what the shard already keeps — the queue state's counters, the log's
//! `LogStats`, the request counters its handler bumps (`Cell`s), the
//! thread's `io::stats` — and carried back over the cross-core report
//! message (`ShardMessage::Report`). Building one reads, and changes
//! nothing but the counts of the report itself (each partition's ack-rate
//! average takes a sample; the shard adds up glommio's executor figures);
//! it is off the data path. It holds no payload and no routing key.

use crate::auth::quota::{QuotaConfig, QuotaKind};
use crate::control::assignment::ShardId;
use crate::io::stats::IoSnapshot;
use crate::queue::{Loss, PartitionId, QueueCounters};

/// Upper bounds (inclusive, microseconds) of the request latency
/// histogram's buckets; a last `+Inf` bucket holds the rest. From a request
/// answered from memory (tens of µs) to a claim that long-polled for its
/// whole wait (seconds).
pub const REQUEST_LATENCY_BUCKETS_US: [u64; 18] = [
    50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000,
    1_000_000, 2_500_000, 5_000_000, 10_000_000, 30_000_000,
];

/// Buckets of the request latency histogram, the `+Inf` one included.
pub const REQUEST_LATENCY_BUCKETS: usize = REQUEST_LATENCY_BUCKETS_US.len() + 1;
const _: () = assert!(REQUEST_LATENCY_BUCKETS_US[0] > 0);

/// One principal's figures on this shard, for the admin port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuotaReport {
    pub principal: String,
    /// The node-wide quotas the shard's policy gives the principal.
    pub config: QuotaConfig,
    /// What is in use on this shard, indexed like [`QuotaKind::ALL`]: for
    /// a rate, the part of this shard's burst that is spent (units); for
    /// claims, deliveries under a live lease plus credits reserved by
    /// claims still waiting.
    pub in_use: [u64; QuotaKind::ALL.len()],
    /// Requests this shard refused `QUOTA_EXCEEDED`, by quota.
    pub rejections: [u64; QuotaKind::ALL.len()],
}

/// Why a request was turned away before it changed anything (counted per
/// partition; the label values of `spool_admission_rejections_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum AdmissionCause {
    /// Enqueue refused: the queue's `max_messages`.
    MaxMessages,
    /// Enqueue refused: the queue's `max_bytes`.
    MaxBytes,
    /// Enqueue refused: the disk is full.
    DiskFull,
    /// Claim refused: the partition's bound on waiting claims.
    ClaimWaitersPerPartition,
    /// Claim refused: the connection's bound on waiting claims.
    ClaimWaitersPerConnection,
    /// Enqueue refused: the ordered partition's most active keys.
    ActiveKeys,
}

impl AdmissionCause {
    pub const ALL: [AdmissionCause; 6] = [
        AdmissionCause::MaxMessages,
        AdmissionCause::MaxBytes,
        AdmissionCause::DiskFull,
        AdmissionCause::ClaimWaitersPerPartition,
        AdmissionCause::ClaimWaitersPerConnection,
        AdmissionCause::ActiveKeys,
    ];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            AdmissionCause::MaxMessages => "max_messages",
            AdmissionCause::MaxBytes => "max_bytes",
            AdmissionCause::DiskFull => "disk_full",
            AdmissionCause::ClaimWaitersPerPartition => "claim_waiters_per_partition",
            AdmissionCause::ClaimWaitersPerConnection => "claim_waiters_per_connection",
            AdmissionCause::ActiveKeys => "active_keys",
        }
    }

    /// Index into [`RequestCounts::rejections`].
    pub fn index(self) -> usize {
        self as usize
    }
}

/// A data request whose latency is measured (the label values of
/// `spool_request_duration_seconds`' `op`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum RequestOp {
    Enqueue,
    Claim,
    Ack,
    Release,
    Extend,
}

impl RequestOp {
    pub const ALL: [RequestOp; 5] = [
        RequestOp::Enqueue,
        RequestOp::Claim,
        RequestOp::Ack,
        RequestOp::Release,
        RequestOp::Extend,
    ];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            RequestOp::Enqueue => "enqueue",
            RequestOp::Claim => "claim",
            RequestOp::Ack => "ack",
            RequestOp::Release => "release",
            RequestOp::Extend => "extend",
        }
    }

    /// Index into [`RequestCounts::latency`].
    pub fn index(self) -> usize {
        self as usize
    }
}

/// One operation's latency histogram: requests per bucket of
/// [`REQUEST_LATENCY_BUCKETS_US`] (not cumulative; the last
/// entry counts those slower than every bound) and the sum in µs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LatencyCounts {
    pub buckets: [u64; REQUEST_LATENCY_BUCKETS],
    pub sum_us: u64,
}

impl LatencyCounts {
    /// Requests counted.
    pub fn count(&self) -> u64 {
        self.buckets.iter().sum()
    }

    /// Adds `other`'s counts (another partition of the same queue).
    pub fn add(&mut self, other: &LatencyCounts) {
        for (mine, theirs) in self.buckets.iter_mut().zip(other.buckets) {
            *mine += theirs;
        }
        self.sum_us += other.sum_us;
    }
}

/// Counts the shard's handler keeps per partition for what the queue state
/// does not count (it folds events; these are requests and refusals).
/// Since the partition was opened.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RequestCounts {
    /// Claim requests answered (with or without deliveries).
    pub claims: u64,
    /// Messages handed out by those claims.
    pub deliveries: u64,
    /// Deliveries of a message delivered before (attempt > 1).
    pub redeliveries: u64,
    /// Lease extensions granted.
    pub extends: u64,
    /// Acks, extends and releases refused as STALE_TOKEN.
    pub stale_tokens: u64,
    /// Refusals by [`AdmissionCause`] (indexed by [`AdmissionCause::index`]).
    pub rejections: [u64; AdmissionCause::ALL.len()],
    /// Latency per [`RequestOp`] (indexed by [`RequestOp::index`]).
    pub latency: [LatencyCounts; RequestOp::ALL.len()],
}

/// One open partition's figures.
#[derive(Debug, Clone, PartialEq)]
pub struct PartitionReport {
    pub queue: String,
    pub partition: PartitionId,
    /// The queue state's counters and cumulative totals (part of the fold,
    /// so they survive restarts).
    pub counters: QueueCounters,
    pub requests: RequestCounts,
    /// Main-lane acks per second, moving average over
    /// `server::counters::DRAIN_RATE_WINDOW_MS` (`None` until a second
    /// report measured one).
    pub ack_rate_per_sec: Option<f64>,
    /// What the partition is charged against its shard's state share
    /// (`partition/memory.rs`).
    pub memory_bytes: u64,
    /// Its member's role, when the partition is replicated.
    pub replica: Option<ReplicaRole>,
    /// Where a resize of its queue leaves it (`server/keys.rs`).
    pub resize: ResizeState,
    /// The counters of each subscription besides the default
    /// (`counters` is the default's), by id.
    pub subscriptions: Vec<SubscriptionCounters>,
    /// Whether the queue has a retention window
    /// (`docs/design/subscriptions.md` §5): records stay in the shared
    /// index (`counters.retained_*`) until it passes them, and one a
    /// subscription had not delivered then is lost for it.
    pub window: bool,
    /// The default subscription's loss reports, oldest first (each
    /// subscription's own are in `subscriptions`); empty without a window.
    pub losses: Vec<Loss>,
    /// Whether the queue is ordered (`docs/design/ordered-lanes.md`): its
    /// lanes are in `counters.lanes`.
    pub ordered: bool,
    /// An ordered queue's oldest waiting message's age when the report
    /// was built (`None`: no message waits, or the queue is unordered).
    pub oldest_waiting_age_ms: Option<u64>,
}

/// One subscription's counters in one partition.
#[derive(Debug, Clone, PartialEq)]
pub struct SubscriptionCounters {
    pub id: crate::queue::SubscriptionId,
    /// Its name in the table when the report was built (empty: the table no
    /// longer names it, and the partition's log is about to end it).
    pub name: String,
    pub counters: QueueCounters,
    /// Its loss reports in the partition, oldest first (the newest
    /// `LOSS_REPORTS_MAX`; `counters.totals.lost` counts every one).
    pub losses: Vec<Loss>,
}

/// A partition's part in its queue's last resize.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ResizeState {
    /// No resize is under way (or it is over).
    #[default]
    None,
    /// An older partition still finishing what it held before the resize.
    Draining,
    /// An added partition handing out nothing until the older ones drained.
    Held,
}

impl ResizeState {
    /// Its value as a gauge: 0, 1 (draining), 2 (held).
    pub fn gauge(self) -> u64 {
        match self {
            ResizeState::None => 0,
            ResizeState::Draining => 1,
            ResizeState::Held => 2,
        }
    }
}

/// A partition this shard owns that did not open, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefusedPartition {
    pub queue: String,
    pub partition: PartitionId,
    pub reason: String,
}

/// Log figures of a shard: the sum of its partitions' `LogStats` since
/// they opened, plus those of partitions deleted since the shard started
/// (so the sum never goes back).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LogTotals {
    /// Commits made durable.
    pub commits: u64,
    /// Bytes those commits occupy on disk.
    pub commit_bytes: u64,
}

/// A shard's client connections (its accept loop's `AcceptStats`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ConnectionCounts {
    /// Connections open now.
    pub active: u64,
    /// Connections accepted since the shard started (refused ones included).
    pub accepted: u64,
    /// Connections refused over `connections_per_shard_max`.
    pub refused_over_limit: u64,
    /// TLS handshakes that failed or timed out.
    pub tls_handshake_failures: u64,
    /// Served connections that ended, per reason, indexed like
    /// `net::connection::ConnectionEnd::REASONS` (`slow_reader`: closed
    /// at `write_timeout`).
    pub ended: [u64; crate::net::connection::ConnectionEnd::REASONS.len()],
}

/// The shard's executor: time spent running tasks and tasks run, since the
/// shard started (glommio's `ExecutorStats`; time asleep or polling for I/O
/// is not counted).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ExecutorCounts {
    pub busy_us: u64,
    pub tasks: u64,
}

/// Everything one shard reports.
#[derive(Debug, Clone, PartialEq)]
pub struct ShardReport {
    pub shard: ShardId,
    pub connections: ConnectionCounts,
    pub executor: ExecutorCounts,
    pub partitions: Vec<PartitionReport>,
    pub refused: Vec<RefusedPartition>,
    pub log: LogTotals,
    /// This shard thread's disk figures.
    pub io: IoSnapshot,
    /// Requests this shard refused `PERMISSION_DENIED`, indexed like
    /// `auth::Operation::ALL`.
    pub auth_denials: [u64; crate::auth::Operation::ALL.len()],
    /// Handshakes this shard refused unverified because their address was
    /// locked out (`auth::limiter`).
    pub auth_lockouts: u64,
    /// Quota figures per principal with a quota (`server::quota`).
    pub quotas: Vec<QuotaReport>,
    /// The shard's journal (journal layout only).
    pub journal: Option<JournalReport>,
    /// Partition visits of the housekeeping ticks since the shard started
    /// (`server/tick.rs`).
    pub tick_visits: u64,
    /// Claims long-polling on the shard now: those waiting on one
    /// partition plus those of partition `ANY` waiting on a queue's ready
    /// ring.
    pub claims_waiting: u64,
    /// The shard's memory pools (`net/memory.rs`): requests, responses,
    /// and its state share (`partition/memory.rs`).
    pub memory: [(&'static str, crate::net::memory::PoolStats); 3],
    /// What the shard's consumer pace did (`net/pace.rs`).
    pub pace: crate::net::pace::PaceStats,
    /// The shard's replication, when the node is in a cluster.
    pub replication: Option<ReplicationReport>,
    /// What the shard heard from each peer node it links to (a cluster).
    pub peers: Vec<crate::shard::replication::PeerHeard>,
    /// The shard's consumer sessions (`docs/design/sessions.md`).
    pub sessions: SessionFigures,
}

/// A replicated partition's member as this node sees it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReplicaRole {
    /// The member's term (the partition's leader epoch once it leads).
    pub term: u64,
    /// The leader it knows (0: none).
    pub leader: u64,
    /// This member leads and serves requests.
    pub serving: bool,
    /// The partition log's last and committed indexes here, and the
    /// highest entry its queue state holds (a follower's lag is the
    /// leader's `committed` minus its `applied`).
    pub last: u64,
    pub committed: u64,
    pub applied: u64,
    /// The highest index every member is known to hold (the group floor
    /// that bounds this node's journal release), and the index its log
    /// starts after now (entries up to it were let go of).
    pub group_floor: u64,
    pub first_index: u64,
}

/// A shard's replication (`server/cluster.rs`): its members and its peer
/// links' traffic since it started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReplicationReport {
    /// This node's id.
    pub node: u64,
    /// Members that lead and serve, and the others.
    pub leading: u64,
    pub following: u64,
    /// Raft messages by outcome (`shard/replication.rs`).
    pub stats: crate::shard::replication::ReplicationStats,
    /// Summed over the open members: terms they took the lead in, times
    /// they stopped serving, diverged states rebuilt, committed entries
    /// folded as followers.
    pub leaderships: u64,
    pub step_downs: u64,
    pub rebuilds: u64,
    pub folded: u64,
    /// Snapshot transfers served and installed (`server/snapshot.rs`).
    pub snapshots: SnapshotStats,
}

/// A shard's snapshot transfers since it started
/// (`docs/design/replication.md` §6).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SnapshotStats {
    /// Transfers this shard served (a source read for a member's pull).
    pub served: u64,
    /// Pieces and bytes it sent.
    pub served_pieces: u64,
    pub served_bytes: u64,
    /// Offers raft-rs was told failed (not pulled in time, or refused).
    pub offers_failed: u64,
    /// Snapshots this shard installed, installs that failed, and the bytes
    /// they brought (side files and record batches).
    pub installed: u64,
    pub install_failures: u64,
    pub installed_bytes: u64,
}

/// A shard's journal and its release (journal layout).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct JournalReport {
    /// Journal files held (the one commits are written to included).
    pub files: u64,
    /// Their bytes on disk.
    pub file_bytes: u64,
    /// Entry bytes of the data entries the shard's open partitions still
    /// index: the batches of their live records (a batch counts whole
    /// while any of its records is live).
    pub live_bytes: u64,
    /// Files (other than the newest) that hold none of those bytes but are
    /// still held: pinned by a partition's checkpoint scan start.
    pub files_without_live_bytes: u64,
    /// The least journal position the shard's partitions needed at the
    /// last release pass (files wholly below it were removed).
    pub needed_from: u64,
    /// Journal files released, and their bytes, since the shard started.
    pub released_files: u64,
    pub released_bytes: u64,
    /// Checkpoints the release passes asked of partitions pinning an old
    /// file since the shard started (only while the shard held more than
    /// `journal_retain_bytes`).
    pub release_checkpoints: u64,
    /// Witness entries the journal made durable since the shard started
    /// (one per idle transition, `shard-journal.md` §11).
    pub witnesses: u64,
    /// Relocation since the shard started: live data entries appended again
    /// at the head, their entry bytes, index entries dropped (no record of
    /// theirs held), and passes that ran (`docs/design/shard-journal.md`
    /// §6).
    pub relocated_entries: u64,
    pub relocated_bytes: u64,
    pub relocation_dropped_entries: u64,
    pub relocation_passes: u64,
    /// The garbage ratio the last pass measured, in millionths (share of
    /// the held files, the newest aside, that holds no live record).
    pub garbage_ratio_millionths: u64,
}

impl ShardReport {
    /// A report with the shard's disk figures and authorization refusals
    /// (this thread's counters: call it on the shard) and nothing else yet.
    pub fn new(shard: ShardId, io: IoSnapshot) -> Self {
        Self {
            shard,
            connections: ConnectionCounts::default(),
            executor: ExecutorCounts::default(),
            partitions: Vec::new(),
            refused: Vec::new(),
            log: LogTotals::default(),
            io,
            auth_denials: crate::auth::denials(),
            auth_lockouts: crate::auth::limiter::lockouts(),
            quotas: Vec::new(),
            journal: None,
            tick_visits: 0,
            claims_waiting: 0,
            memory: crate::net::memory::ShardMemory::of_this_shard().stats(),
            pace: crate::net::pace::PaceStats::default(),
            replication: None,
            peers: Vec::new(),
            sessions: SessionFigures::default(),
        }
    }
}

/// Why a consumer session ended, as the metrics label it: closed by its
/// consumer, its connection ended, its heartbeat timed out, or a newer
/// session of its member replaced it.
pub const SESSION_END_CAUSES: [&str; 4] = ["closed", "connection", "timeout", "replaced"];

/// A shard's consumer sessions (`server/sessions.rs`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SessionFigures {
    /// Sessions open now.
    pub open: u64,
    /// Claims the open sessions track now.
    pub claims_tracked: u64,
    /// Sessions opened since the shard started.
    pub opened: u64,
    /// Sessions ended, by [`SESSION_END_CAUSES`].
    pub ended: [u64; 4],
    /// Claims released because their session ended.
    pub claims_released: u64,
}
