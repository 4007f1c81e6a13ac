//! Named limits of the vote log (`docs/design/shard-journal.md` §16),
//! kept with it as the journal keeps its own (`log/journal/limits.rs`);
//! the broker-wide bounds they sit inside are `crate::limits`'.

use super::record::RECORD_LEN;
use crate::limits::PAGE_BYTES;
use crate::log::journal::HANDLES_MAX;

/// Most partitions one shard's vote log holds a vote for: every partition
/// its handles table can hold.
pub const VOTE_PARTITIONS_MAX: usize = HANDLES_MAX;
/// Size past which a shard's vote log is compacted, and the largest file
/// its open reads (a larger one is refused). 8 MiB: four times a compacted
/// log of [`VOTE_PARTITIONS_MAX`] partitions (2 MiB at 32 bytes a record),
/// so a compaction rewrites at most a third of what was appended since the
/// last one, and at a page per lone vote 2,048 cycles fit between
/// compactions; an open reads it in one read. Raise it freely; lower it
/// only knowing that an open refuses a file written under a larger bound.
pub const VOTE_LOG_BYTES_MAX: u64 = 8 << 20;
/// Smallest compaction bound a vote log may be set to (tests compact often
/// with it).
pub const VOTE_LOG_BYTES_MIN: u64 = PAGE_BYTES;

const _: () = assert!(VOTE_LOG_BYTES_MAX.is_multiple_of(PAGE_BYTES));
const _: () = assert!(VOTE_LOG_BYTES_MIN.is_multiple_of(PAGE_BYTES));
const _: () = assert!(VOTE_LOG_BYTES_MIN <= VOTE_LOG_BYTES_MAX);
// A compacted file of every partition plus a cycle of every partition
// stays within the bound, so the file never passes it.
const _: () = assert!(VOTE_LOG_BYTES_MAX >= 2 * (VOTE_PARTITIONS_MAX * RECORD_LEN) as u64);
// Cycle numbers (at most one per page of a file) fit their u32.
const _: () = assert!(VOTE_LOG_BYTES_MAX / PAGE_BYTES < u32::MAX as u64);
