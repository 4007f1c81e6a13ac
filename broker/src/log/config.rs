//! [`LogConfig`]: the broker's log settings, validated against
//! `crate::limits`; each shard journal derives its own configuration from
//! them (`journal::JournalConfig::for_partitions`).

use thiserror::Error;

use crate::limits::{
    COMMIT_BYTES_DEFAULT, COMMIT_BYTES_MAX, DATA_PENDING_BYTES_DEFAULT, INFLIGHT_COMMITS_DEFAULT,
    INFLIGHT_COMMITS_MAX, PAGE_BYTES, PENDING_BYTES_DEFAULT, PENDING_BYTES_MAX,
    SEGMENT_BYTES_DEFAULT, SEGMENT_BYTES_MAX, SEGMENT_BYTES_MIN, TAIL_CACHE_BYTES_DEFAULT,
    TAIL_CACHE_BYTES_MAX,
};
use crate::log::journal::commit_span;
use spool_wire::limits::{BATCH_BYTES_MAX, BATCH_HEADER_BYTES};

/// The log settings of a broker.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogConfig {
    /// Size of each journal segment file (pre-zeroed); a commit never spans
    /// two.
    pub segment_bytes: u64,
    /// Target size of one group commit: gathering stops before a batch that
    /// would push the commit past it. A single larger batch commits alone.
    pub commit_bytes: u64,
    /// Largest batch `append` accepts (≤ the wire limit).
    pub batch_bytes_max: u64,
    /// Commits written but not yet synced at once (pipelining depth).
    pub inflight_commits_max: usize,
    /// Bound on queued-but-unwritten control bytes per shard; beyond it an
    /// append is refused with backpressure.
    pub pending_bytes_max: u64,
    /// Bound on queued-but-unwritten data bytes per shard, so claims and
    /// acks never queue behind more than this much producer data.
    pub data_pending_bytes_max: u64,
    /// Bytes of recent commits kept in memory to serve tail reads.
    pub tail_cache_bytes: u64,
}

impl Default for LogConfig {
    fn default() -> Self {
        Self {
            segment_bytes: SEGMENT_BYTES_DEFAULT,
            commit_bytes: COMMIT_BYTES_DEFAULT,
            batch_bytes_max: BATCH_BYTES_MAX as u64,
            inflight_commits_max: INFLIGHT_COMMITS_DEFAULT,
            pending_bytes_max: PENDING_BYTES_DEFAULT,
            data_pending_bytes_max: DATA_PENDING_BYTES_DEFAULT,
            tail_cache_bytes: TAIL_CACHE_BYTES_DEFAULT,
        }
    }
}

/// A log setting outside its limits.
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
    /// Checks every setting against its limit and the relations between
    /// them.
    ///
    /// # Errors
    /// The first violated rule.
    pub fn validate(&self) -> Result<(), ConfigError> {
        in_range("segment_bytes", self.segment_bytes, SEGMENT_BYTES_MIN, SEGMENT_BYTES_MAX)?;
        page_aligned("segment_bytes", self.segment_bytes)?;
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
        in_range("tail_cache_bytes", self.tail_cache_bytes, 0, TAIL_CACHE_BYTES_MAX)?;
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

    /// Largest number of bytes one commit can occupy on disk.
    pub fn commit_span_max(&self) -> u64 {
        self.commit_bytes.max(commit_span(self.batch_bytes_max))
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
    }
}
