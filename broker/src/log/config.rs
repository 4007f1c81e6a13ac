//! [`LogConfig`]: the runtime knobs of one partition log, validated against
//! `crate::limits` before a log opens.

use thiserror::Error;

use crate::limits::{
    COMMIT_BYTES_DEFAULT, COMMIT_BYTES_MAX, DATA_PENDING_BYTES_DEFAULT,
    INDEX_INTERVAL_BYTES_DEFAULT, INDEX_INTERVAL_BYTES_MIN, INFLIGHT_COMMITS_DEFAULT,
    INFLIGHT_COMMITS_MAX, PAGE_BYTES, PENDING_BYTES_DEFAULT, PENDING_BYTES_MAX,
    RESERVE_STEP_BYTES_DEFAULT, SEGMENT_BYTES_DEFAULT, SEGMENT_BYTES_INITIAL_DEFAULT,
    SEGMENT_BYTES_MAX, SEGMENT_BYTES_MIN, SEGMENT_PREPARE_AT_PERCENT, TAIL_CACHE_BYTES_DEFAULT,
    TAIL_CACHE_BYTES_MAX,
};
use crate::log::layout::commit_span;
use spool_wire::batch::BatchKind;
use spool_wire::limits::{BATCH_BYTES_MAX, BATCH_HEADER_BYTES};

/// Runtime configuration of one partition log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogConfig {
    /// Size segment files grow to (pre-zeroed); a commit never spans two.
    pub segment_bytes: u64,
    /// Size of a log's first segment (`SEGMENT_BYTES_MIN ..=
    /// SEGMENT_BYTES_MAX`; a value above `segment_bytes` means
    /// `segment_bytes`). Each next segment doubles the one before, up to
    /// `segment_bytes`, and
    /// is at least as large as the commit that opens it
    /// ([`LogConfig::next_segment_bytes`]).
    pub segment_bytes_initial: u64,
    /// Target size of one group commit: gathering stops before a batch that
    /// would push the commit past it. A single larger batch commits alone.
    pub commit_bytes: u64,
    /// Largest batch `append` accepts (≤ the wire limit).
    pub batch_bytes_max: u64,
    /// Commits written but not yet synced at once (pipelining depth).
    pub inflight_commits_max: usize,
    /// Bound on gathered-but-unwritten bytes; beyond it `append` returns
    /// `LogError::Backpressure`.
    pub pending_bytes_max: u64,
    /// Tighter bound for data batches: a data append waits (or gets
    /// `LogError::Backpressure`) once this much is pending, leaving the rest
    /// of `pending_bytes_max` to control events so claims and acks never
    /// queue behind more than this much producer data. The effective bound
    /// is the smaller of the two.
    pub data_pending_bytes_max: u64,
    /// Spacing of sparse index entries, in segment bytes.
    pub index_interval_bytes: u64,
    /// Bytes of recent commits kept in memory to serve tail reads.
    pub tail_cache_bytes: u64,
    /// Step of the written-bytes reservation (`PAGE_BYTES ..=
    /// SEGMENT_BYTES_MAX`, page-aligned): how far past a commit the durable
    /// bound of written bytes is extended, and so how far past the written
    /// bytes a reopen searches for non-zero bytes (`segment-format.md`,
    /// "Written-bytes reservation").
    pub reserve_step_bytes: u64,
}

impl Default for LogConfig {
    fn default() -> Self {
        Self {
            segment_bytes: SEGMENT_BYTES_DEFAULT,
            segment_bytes_initial: SEGMENT_BYTES_INITIAL_DEFAULT,
            commit_bytes: COMMIT_BYTES_DEFAULT,
            batch_bytes_max: BATCH_BYTES_MAX as u64,
            inflight_commits_max: INFLIGHT_COMMITS_DEFAULT,
            pending_bytes_max: PENDING_BYTES_DEFAULT,
            data_pending_bytes_max: DATA_PENDING_BYTES_DEFAULT,
            index_interval_bytes: INDEX_INTERVAL_BYTES_DEFAULT,
            tail_cache_bytes: TAIL_CACHE_BYTES_DEFAULT,
            reserve_step_bytes: RESERVE_STEP_BYTES_DEFAULT,
        }
    }
}

/// What is wrong with a [`LogConfig`].
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConfigError {
    #[error("{field} = {value} is outside [{min}, {max}]")]
    OutOfRange { field: &'static str, value: u64, min: u64, max: u64 },
    #[error("{field} = {value} is not a multiple of {PAGE_BYTES}")]
    NotPageAligned { field: &'static str, value: u64 },
    #[error("segment_bytes {segment_bytes} cannot hold one commit of {commit_span_bytes} bytes")]
    SegmentTooSmall { segment_bytes: u64, commit_span_bytes: u64 },
    #[error("pending_bytes_max {pending_bytes_max} cannot hold one batch of {batch_bytes_max}")]
    PendingTooSmall { pending_bytes_max: u64, batch_bytes_max: u64 },
    #[error(
        "data_pending_bytes_max {data_pending_bytes_max} cannot hold one batch of {batch_bytes_max}"
    )]
    DataPendingTooSmall { data_pending_bytes_max: u64, batch_bytes_max: u64 },
}

fn in_range(field: &'static str, value: u64, min: u64, max: u64) -> Result<(), ConfigError> {
    if value < min || value > max {
        return Err(ConfigError::OutOfRange { field, value, min, max });
    }
    Ok(())
}

fn page_aligned(field: &'static str, value: u64) -> Result<(), ConfigError> {
    if !value.is_multiple_of(PAGE_BYTES) {
        return Err(ConfigError::NotPageAligned { field, value });
    }
    Ok(())
}

impl LogConfig {
    /// Checks every knob against its limit and the relations between them.
    ///
    /// # Errors
    /// The first violated rule, as a [`ConfigError`].
    pub fn validate(&self) -> Result<(), ConfigError> {
        in_range("segment_bytes", self.segment_bytes, SEGMENT_BYTES_MIN, SEGMENT_BYTES_MAX)?;
        page_aligned("segment_bytes", self.segment_bytes)?;
        in_range(
            "segment_bytes_initial",
            self.segment_bytes_initial,
            SEGMENT_BYTES_MIN,
            SEGMENT_BYTES_MAX,
        )?;
        page_aligned("segment_bytes_initial", self.segment_bytes_initial)?;
        in_range("commit_bytes", self.commit_bytes, PAGE_BYTES, COMMIT_BYTES_MAX)?;
        page_aligned("commit_bytes", self.commit_bytes)?;
        in_range(
            "batch_bytes_max",
            self.batch_bytes_max,
            BATCH_HEADER_BYTES as u64,
            BATCH_BYTES_MAX as u64,
        )?;
        in_range(
            "inflight_commits_max",
            self.inflight_commits_max as u64,
            1,
            INFLIGHT_COMMITS_MAX as u64,
        )?;
        in_range("pending_bytes_max", self.pending_bytes_max, PAGE_BYTES, PENDING_BYTES_MAX)?;
        in_range(
            "data_pending_bytes_max",
            self.data_pending_bytes_max,
            PAGE_BYTES,
            PENDING_BYTES_MAX,
        )?;
        in_range(
            "index_interval_bytes",
            self.index_interval_bytes,
            INDEX_INTERVAL_BYTES_MIN,
            SEGMENT_BYTES_MAX,
        )?;
        in_range("tail_cache_bytes", self.tail_cache_bytes, 0, TAIL_CACHE_BYTES_MAX)?;
        in_range("reserve_step_bytes", self.reserve_step_bytes, PAGE_BYTES, SEGMENT_BYTES_MAX)?;
        page_aligned("reserve_step_bytes", self.reserve_step_bytes)?;
        let commit_span_bytes = self.commit_span_max();
        if commit_span_bytes > self.segment_bytes {
            return Err(ConfigError::SegmentTooSmall {
                segment_bytes: self.segment_bytes,
                commit_span_bytes,
            });
        }
        if self.pending_bytes_max < commit_span(self.batch_bytes_max) {
            return Err(ConfigError::PendingTooSmall {
                pending_bytes_max: self.pending_bytes_max,
                batch_bytes_max: self.batch_bytes_max,
            });
        }
        if self.data_pending_bytes_max < commit_span(self.batch_bytes_max) {
            return Err(ConfigError::DataPendingTooSmall {
                data_pending_bytes_max: self.data_pending_bytes_max,
                batch_bytes_max: self.batch_bytes_max,
            });
        }
        Ok(())
    }

    /// The pending bound an append of `kind` is held to: data batches stop
    /// at the tighter data bound, control batches may use the whole of it.
    pub fn pending_limit(&self, kind: BatchKind) -> u64 {
        match kind {
            BatchKind::Data => self.data_pending_bytes_max.min(self.pending_bytes_max),
            _ => self.pending_bytes_max,
        }
    }

    /// Capacity of the segment after one of `current_bytes` (0: the log has
    /// no zero-filled segment yet), for a commit of `span_bytes` that opens
    /// it: double the current one, starting at `segment_bytes_initial` and
    /// capped at `segment_bytes`, and never smaller than the commit.
    pub fn next_segment_bytes(&self, current_bytes: u64, span_bytes: u64) -> u64 {
        let initial = self.segment_bytes_initial.min(self.segment_bytes);
        let grown = if current_bytes < initial {
            initial
        } else {
            current_bytes.saturating_mul(2).min(self.segment_bytes)
        };
        grown.max(span_bytes)
    }

    /// Fill of a segment of `capacity_bytes` at which its successor is
    /// prepared ([`SEGMENT_PREPARE_AT_PERCENT`]); `None` for a log without a
    /// zero-filled segment, whose first append prepares one.
    pub fn prepare_at_bytes(capacity_bytes: u64) -> Option<u64> {
        (capacity_bytes > 0).then(|| capacity_bytes * SEGMENT_PREPARE_AT_PERCENT / 100)
    }

    /// Largest number of bytes one commit can occupy on disk.
    pub fn commit_span_max(&self) -> u64 {
        self.commit_bytes.max(commit_span(self.batch_bytes_max))
    }

    /// How far before the end of written data a torn write can reach: every
    /// commit that may have been in flight at a crash. An invalid batch
    /// further back than this is media corruption, not a torn write.
    ///
    /// Computed from this config: reopening with a smaller window than the
    /// run that wrote the log can only turn a torn tail into a refusal to
    /// open (fail closed), never hide corruption.
    pub fn recovery_window_bytes(&self) -> u64 {
        self.inflight_commits_max as u64 * self.commit_span_max()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_validate_and_bad_values_are_named() {
        // Goal: the default config is valid and each rule rejects with a typed error.
        assert_eq!(LogConfig::default().validate(), Ok(()));
        let unaligned = LogConfig { commit_bytes: 5000, ..LogConfig::default() };
        assert!(matches!(
            unaligned.validate(),
            Err(ConfigError::NotPageAligned { field: "commit_bytes", .. })
        ));
        let tiny = LogConfig {
            segment_bytes: SEGMENT_BYTES_MIN,
            commit_bytes: PAGE_BYTES,
            ..LogConfig::default()
        };
        assert!(matches!(tiny.validate(), Err(ConfigError::SegmentTooSmall { .. })));
        let zero_inflight = LogConfig { inflight_commits_max: 0, ..LogConfig::default() };
        assert!(matches!(zero_inflight.validate(), Err(ConfigError::OutOfRange { .. })));
        let initial_over =
            LogConfig { segment_bytes_initial: SEGMENT_BYTES_MAX * 2, ..LogConfig::default() };
        assert!(matches!(
            initial_over.validate(),
            Err(ConfigError::OutOfRange { field: "segment_bytes_initial", .. })
        ));
    }

    #[test]
    fn segments_start_small_double_and_hold_their_first_commit() {
        // Goal: segment sizes follow initial, ×2, …, capped at segment_bytes, and a commit
        // larger than the planned size gets a segment it fits. Method: the pure rule.
        let config = LogConfig::default();
        let mut sizes = vec![];
        let mut current = 0;
        for _ in 0..9 {
            current = config.next_segment_bytes(current, PAGE_BYTES);
            sizes.push(current >> 20);
        }
        assert_eq!(sizes, [1, 2, 4, 8, 16, 32, 64, 64, 64]);
        let big_commit = config.commit_span_max();
        assert_eq!(config.next_segment_bytes(0, big_commit), big_commit);
        assert_eq!(config.next_segment_bytes(1 << 20, big_commit), big_commit);
        let capped = LogConfig { segment_bytes: 256 << 10, ..LogConfig::default() };
        assert_eq!(capped.next_segment_bytes(0, PAGE_BYTES), 256 << 10);
        assert_eq!(LogConfig::prepare_at_bytes(0), None);
        assert_eq!(LogConfig::prepare_at_bytes(1 << 20), Some((1 << 20) / 2));
    }
}
