//! Named limits and defaults of one shard journal: file sizes, commit and
//! lane bounds, the read cache, the handles table, the entries a replicated
//! log holds for reads by index. `JournalConfig` (`config.rs`) validates a
//! journal's settings against them and derives them from the broker's log
//! settings (`JournalConfig::for_partitions`); the broker-wide bounds they
//! sit inside are `crate::limits`'.

use super::entry::ENTRY_BYTES_MAX;
use crate::limits::{COMMIT_BYTES_MAX, INFLIGHT_COMMITS_MAX, PAGE_BYTES};

/// Default size of one journal file (pre-zeroed, overwritten in place).
pub const JOURNAL_FILE_BYTES_DEFAULT: u64 = 64 << 20;
/// Smallest journal file (small files keep tests fast).
pub const JOURNAL_FILE_BYTES_MIN: u64 = 64 << 10;
/// Largest journal file: bounds a recovery scan and a repair write.
pub const JOURNAL_FILE_BYTES_MAX: u64 = 1 << 30;
/// Default target of data bytes (control included) in one commit.
pub const JOURNAL_COMMIT_BYTES_DEFAULT: u64 = 1 << 20;
/// Default bound on control entries in one commit: at ≈ 40 B an ack, about
/// 1,600 acks per cycle.
pub const CONTROL_COMMIT_BYTES_DEFAULT: u64 = 64 << 10;
/// Default bound on queued (not yet built into a commit) control bytes:
/// sixteen cycles' worth.
pub const CONTROL_PENDING_BYTES_DEFAULT: u64 = 1 << 20;
/// Default bound on queued data bytes. Control entries never wait behind
/// them (they go first in every cycle), so this bounds memory and producer
/// latency, not ack latency.
pub const DATA_PENDING_BYTES_DEFAULT: u64 = 32 << 20;
/// Largest configurable bound on queued bytes of one lane.
pub const LANE_PENDING_BYTES_MAX: u64 = 256 << 20;
/// Default number of commits written but not yet part of the durable prefix.
pub const JOURNAL_INFLIGHT_COMMITS_DEFAULT: usize = 2;
/// Default bound on durable commits kept in memory to serve reads of recent
/// entries without a disk read (§7, the shard's read cache).
pub const JOURNAL_READ_CACHE_BYTES_DEFAULT: u64 = 8 << 20;
/// Largest configurable read cache of one shard journal.
pub const JOURNAL_READ_CACHE_BYTES_MAX: u64 = 1 << 30;

const _: () = assert!(JOURNAL_FILE_BYTES_DEFAULT.is_multiple_of(PAGE_BYTES));
const _: () = assert!(JOURNAL_FILE_BYTES_MIN.is_multiple_of(PAGE_BYTES));
const _: () = assert!(CONTROL_COMMIT_BYTES_DEFAULT < JOURNAL_COMMIT_BYTES_DEFAULT);
const _: () = assert!(JOURNAL_COMMIT_BYTES_DEFAULT <= COMMIT_BYTES_MAX);
const _: () = assert!(CONTROL_PENDING_BYTES_DEFAULT >= CONTROL_COMMIT_BYTES_DEFAULT);
const _: () = assert!(DATA_PENDING_BYTES_DEFAULT >= ENTRY_BYTES_MAX);
const _: () = assert!(JOURNAL_INFLIGHT_COMMITS_DEFAULT <= INFLIGHT_COMMITS_MAX);
const _: () = assert!(JOURNAL_READ_CACHE_BYTES_DEFAULT <= JOURNAL_READ_CACHE_BYTES_MAX);

/// Most handles one shard's table holds (16 B each: 1 MiB of table).
pub const HANDLES_MAX: usize = 65_536;

/// Most committed entries of one replicated partition whose journal
/// position is held for reads by entry index (12 B each, 16 B per term
/// change: 3 MiB per partition at most); older ones answer
/// `JournalError::Compacted` (`docs/design/shard-journal.md` §14.5).
pub const LOG_HELD_ENTRIES_MAX: usize = 1 << 18;
