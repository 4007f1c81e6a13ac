//! Named limits of the queue state machine. Every map, batch and scan the
//! queue keeps or performs is bounded by one of these or by a validated config
//! field; exceeding one is a typed error (or a shorter answer the caller loops
//! on), never unbounded work.

use spool_wire::proto::limits as wire;

use super::types::Millis;

/// Fewest priority bands a queue may have.
pub const PRIORITY_BANDS_MIN: u8 = 4;
/// Most priority bands a queue may have (the record format's limit).
pub const PRIORITY_BANDS_MAX: u8 = spool_wire::limits::PRIORITY_BANDS_MAX;
/// Most fairness classes a partition has: its priority bands plus the
/// retry class (the claim path keeps one value per class inline,
/// `fairness::PerClass`).
pub const CLASSES_MAX: usize = PRIORITY_BANDS_MAX as usize + 1;
/// Largest weighted-round-robin share of one class.
pub const WEIGHT_MAX: u32 = 1024;
// The bounds a request can name are the protocol's (`spool_wire`'s limits),
// widened here to `Millis` (u64) where the wire carries a u32: one value per
// limit, and a queue config the wire accepts is one the queue accepts.

/// Longest lease a request may name: one day.
pub const LEASE_MS_MAX: Millis = wire::LEASE_MS_MAX as Millis;
/// Longest lease lifetime a queue may allow: one day.
pub const LEASE_LIFETIME_MS_MAX: Millis = wire::LEASE_LIFETIME_MS_MAX;
/// Longest backoff cap a queue may configure: one day.
pub const BACKOFF_CAP_MS_MAX: Millis = wire::BACKOFF_CAP_MS_MAX as Millis;
/// Longest dedupe window: seven days.
pub const DEDUPE_WINDOW_MS_MAX: Millis = wire::DEDUPE_WINDOW_MS_MAX;
/// Longest retention window by time: thirty days.
pub const RETENTION_MS_MAX: Millis = wire::RETENTION_MS_MAX;
/// Shortest retention window by time: one second.
pub const RETENTION_MS_MIN: Millis = wire::RETENTION_MS_MIN;
/// Smallest retention window by size: 1 MiB.
pub const RETENTION_BYTES_MIN: u64 = wire::RETENTION_BYTES_MIN;
/// Most shared records one `WindowPassed` drops: the tick names a bound
/// below at most this many and ticks again (the apply of one event is
/// bounded work).
pub const WINDOW_DROP_MAX: usize = 4096;
/// Loss reports kept per subscription (`Loss`, the newest): older ones
/// survive only in the subscription's `lost` total.
pub const LOSS_REPORTS_MAX: usize = 32;
/// Latest `not_before` a release may ask for, relative to now: seven days.
pub const RELEASE_DELAY_MS_MAX: Millis = wire::RELEASE_DELAY_MS_MAX as Millis;
/// Largest `max_messages` a queue partition may be configured with.
pub const QUEUE_MESSAGES_MAX: u64 = 1 << 32;
/// Largest `max_bytes` a queue partition may be configured with (16 TiB).
pub const QUEUE_BYTES_MAX: u64 = 1 << 44;
/// Most active routing keys (keys with a message held) an ordered
/// subscription of one partition keeps: a new key past it is refused at
/// admission (`ACTIVE_KEYS_FULL`) until one finishes. ≈ 55 B of lane state
/// each (`docs/design/ordered-lanes.md`): at most ≈ 230 MB per partition,
/// and each is also a held message charged against the shard's budget.
pub const ORDERED_ACTIVE_KEYS_MAX: usize = 1 << 22;
/// Most messages one claim may ask for (its credits).
pub const CLAIM_CREDITS_MAX: u32 = wire::CLAIM_CREDITS_MAX;
/// Most expired messages one claim skips (and reports as events) before it
/// stops; the caller's next claim continues.
pub const CLAIM_EXPIRED_SCAN_MAX: usize = 4096;
/// Most events one `tick` returns; the caller ticks again while it gets a
/// full answer.
pub const TICK_EVENTS_MAX: usize = 4096;
/// Most events one purge or redrive returns.
pub const ADMIN_EVENTS_MAX: usize = 4096;
/// Most dead letters one peek returns.
pub const PEEK_MAX: usize = 1024;
/// Most enqueues one admission batch checks (a data batch's record limit).
pub const ADMISSION_BATCH_MAX: usize = spool_wire::limits::BATCH_RECORDS_MAX as usize;
/// Never-claimed messages are stored in fixed chunks of this many entries, so
/// a backlog costs its entries plus one small header per chunk.
pub const FRESH_CHUNK_ENTRIES: usize = 64;
/// Claimed, scheduled and retried messages are kept in sorted chunks of
/// this many entries (see `chunk_map`).
pub const WARM_CHUNK_ENTRIES: usize = 64;
/// The dedupe window is kept in this many time buckets ("generations") of
/// `window / DEDUPE_GENERATIONS` each; a bucket is dropped whole once it left
/// the window, so at most this fraction of the window lingers past it.
pub const DEDUPE_GENERATIONS: usize = 8;
/// Most entries one dedupe generation holds (its slots index 24 bits); a
/// full generation closes early and the next one opens.
pub const DEDUPE_GENERATION_ENTRIES_MAX: usize = (1 << 24) - 2;
/// Dedupe entries are stored in fixed chunks of this many (24 B each).
pub const DEDUPE_CHUNK_ENTRIES: usize = 2048;
/// Ids an admission's dedupe memo keeps room for between batches (the ids
/// its checks found absent, `dedupe.rs`): a larger batch allocates what it
/// needs and the memo is dropped at the next admission, so one huge batch
/// does not pin 24 bytes per record for the partition's life (the same rule
/// as the partition's request scratch).
pub const DEDUPE_ABSENT_MEMO_KEPT_MAX: usize = 1024;
/// What one held message may cost the queue state at most, whatever its
/// phase: a never-claimed one takes ≤ 32 B, a claimed, scheduled or retried
/// one ≤ 128 B, a dead letter ≤ 187 B (`tests/queue_memory.rs`
/// checks the charge covers each). A shard's state share is charged this
/// much per held message (`PartitionState::memory_charge`), so no later
/// claim, release or quarantine of an admitted message can take the shard
/// over its budget: only an enqueue is refused for memory.
pub const MESSAGE_STATE_BYTES_MAX: u64 = 192;
/// What one dedupe window entry costs at most: its 24-byte entry and its
/// share of the index (measured ≤ 40 B by `tests/queue_memory.rs`).
pub const DEDUPE_ENTRY_BYTES_MAX: u64 = 40;
/// What one run of attributed offsets costs at most (stored quotas: one
/// run per batch when producers interleave single-record batches).
pub const STORED_RUN_BYTES_MAX: u64 = 64;
/// What one skipped offset of a subscription costs at most (an entry of
/// a per-band `BTreeSet<Offset>`, `queue/state/shared.rs`): only a
/// subscription that took a record out of order while another still has
/// it to deliver keeps one.
pub const SKIPPED_ENTRY_BYTES_MAX: u64 = 32;
/// Most subscriptions a queue may have, the default included
/// (`docs/design/subscriptions.md` §2): the protocol's, which
/// DescribeQueue v2 lists at most.
pub const SUBSCRIPTIONS_PER_QUEUE_MAX: usize = wire::SUBSCRIPTIONS_PER_QUEUE_MAX;
/// Most voters, and most learners, a replicated partition's group names
/// in a checkpoint (`queue/members.rs`): a replication factor of at most 5
/// and one replacement at a time keep it far below; a bound on what a
/// corrupt count can make `restore` read.
pub const GROUP_MEMBERS_MAX: usize = 16;
/// Largest snapshot `restore` accepts (1 GiB): a bound on what a corrupt
/// length field can make it allocate.
pub const SNAPSHOT_BYTES_MAX: usize = 1 << 30;

const _: () = assert!(PRIORITY_BANDS_MIN <= PRIORITY_BANDS_MAX);
const _: () = assert!(FRESH_CHUNK_ENTRIES.is_power_of_two());
