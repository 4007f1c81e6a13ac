//! [`JournalConfig`]: the knobs of one shard journal and their named limits,
//! validated before a journal opens.

use thiserror::Error;

use super::entry::{ENTRY_BYTES_MAX, ENTRY_HEADER_BYTES};
use super::layout::page_ceil;
use crate::limits::{COMMIT_BYTES_MAX, INFLIGHT_COMMITS_MAX, PAGE_BYTES};

pub use super::limits::{
    CONTROL_COMMIT_BYTES_DEFAULT, CONTROL_PENDING_BYTES_DEFAULT, DATA_PENDING_BYTES_DEFAULT,
    JOURNAL_COMMIT_BYTES_DEFAULT, JOURNAL_FILE_BYTES_DEFAULT, JOURNAL_FILE_BYTES_MAX,
    JOURNAL_FILE_BYTES_MIN, JOURNAL_INFLIGHT_COMMITS_DEFAULT, JOURNAL_READ_CACHE_BYTES_DEFAULT,
    JOURNAL_READ_CACHE_BYTES_MAX, LANE_PENDING_BYTES_MAX,
};

/// Runtime configuration of one shard journal.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JournalConfig {
    /// Size of every new journal file (pre-zeroed before it is named).
    pub file_bytes: u64,
    /// Target bytes of one commit: control entries, then data entries while
    /// the total stays within this. A data entry larger than what is left
    /// still goes when it is the cycle's first data entry.
    pub commit_bytes: u64,
    /// Bound on control entries in one commit; also the largest control entry.
    pub control_commit_bytes: u64,
    /// Largest data entry (header + batch).
    pub entry_bytes_max: u64,
    /// Commits between the durable watermark and the newest write, at most.
    pub inflight_commits_max: usize,
    /// Queued control bytes beyond which `append` answers back-pressure.
    pub control_pending_bytes_max: u64,
    /// Queued data bytes beyond which `append` answers back-pressure.
    pub data_pending_bytes_max: u64,
    /// Bytes of recent durable commits kept in memory for reads (0: every
    /// read goes to the file). Whole commits are cached, the oldest dropped
    /// first.
    pub read_cache_bytes: u64,
    /// Bytes of chunks read from journal files kept in memory for the
    /// reads that follow (0: each read's chunk serves that read only).
    /// Chunks of [`crate::limits::JOURNAL_READ_CHUNK_BYTES`], the oldest
    /// dropped first.
    pub read_ahead_bytes: u64,
}

impl Default for JournalConfig {
    fn default() -> Self {
        Self {
            file_bytes: JOURNAL_FILE_BYTES_DEFAULT,
            commit_bytes: JOURNAL_COMMIT_BYTES_DEFAULT,
            control_commit_bytes: CONTROL_COMMIT_BYTES_DEFAULT,
            entry_bytes_max: ENTRY_BYTES_MAX,
            inflight_commits_max: JOURNAL_INFLIGHT_COMMITS_DEFAULT,
            control_pending_bytes_max: CONTROL_PENDING_BYTES_DEFAULT,
            data_pending_bytes_max: DATA_PENDING_BYTES_DEFAULT,
            read_cache_bytes: JOURNAL_READ_CACHE_BYTES_DEFAULT,
            read_ahead_bytes: JOURNAL_READ_CACHE_BYTES_DEFAULT,
        }
    }
}

/// What is wrong with a [`JournalConfig`].
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum JournalConfigError {
    #[error("{field} = {value} is outside [{min}, {max}]")]
    OutOfRange { field: &'static str, value: u64, min: u64, max: u64 },
    #[error("{field} = {value} is not a multiple of {PAGE_BYTES}")]
    NotPageAligned { field: &'static str, value: u64 },
    #[error("control_commit_bytes {control} must be below commit_bytes {commit}")]
    ControlNotBelowCommit { control: u64, commit: u64 },
    #[error("file_bytes {file_bytes} cannot hold the largest commit ({commit_span_bytes} bytes)")]
    FileTooSmall { file_bytes: u64, commit_span_bytes: u64 },
    #[error("{field} = {value} cannot hold one entry of {entry_bytes} bytes")]
    PendingTooSmall { field: &'static str, value: u64, entry_bytes: u64 },
}

fn in_range(field: &'static str, value: u64, min: u64, max: u64) -> Result<(), JournalConfigError> {
    if value < min || value > max {
        return Err(JournalConfigError::OutOfRange { field, value, min, max });
    }
    Ok(())
}

fn page_aligned(field: &'static str, value: u64) -> Result<(), JournalConfigError> {
    if !value.is_multiple_of(PAGE_BYTES) {
        return Err(JournalConfigError::NotPageAligned { field, value });
    }
    Ok(())
}

impl JournalConfig {
    /// The journal of a shard whose partitions were configured with
    /// `log` (the broker's log settings, `BrokerConfig::log_config`): the
    /// same commit size, commits in flight, per-lane pending bounds and read
    /// cache (`tail_cache_bytes` for the commit cache, and as much again for
    /// chunks read from the files); files of `segment_bytes` (at least [`JOURNAL_FILE_BYTES_MIN`]
    /// and large enough for the largest commit); entries as large as the
    /// largest batch plus its header. A control commit must take the
    /// largest control batch a partition appends (a claim or fence of
    /// `CONTROL_BATCH_EVENTS_MAX` events, ≈ 192 KiB): at least
    /// [`CONTROL_COMMIT_BYTES_DEFAULT`] and that, and a commit at least twice
    /// it, so data still goes in a cycle whose control lane is full.
    pub fn for_partitions(log: &crate::log::LogConfig) -> Self {
        use crate::limits::{CONTROL_BATCH_EVENTS_MAX, CONTROL_BATCH_OVERHEAD_BYTES};
        let header = ENTRY_HEADER_BYTES as u64;
        let control_batch_max = CONTROL_BATCH_OVERHEAD_BYTES
            + CONTROL_BATCH_EVENTS_MAX as u64 * (crate::queue::CLAIMED_EVENT_BYTES as u64 + 8);
        let control_commit_bytes =
            page_ceil(control_batch_max + header).max(CONTROL_COMMIT_BYTES_DEFAULT);
        let commit_bytes =
            page_ceil(log.commit_bytes.max(PAGE_BYTES)).max(2 * control_commit_bytes);
        let entry_bytes_max = (log.batch_bytes_max + header).min(ENTRY_BYTES_MAX);
        let mut config = Self {
            file_bytes: page_ceil(log.segment_bytes.max(JOURNAL_FILE_BYTES_MIN)),
            commit_bytes,
            control_commit_bytes,
            entry_bytes_max,
            inflight_commits_max: log.inflight_commits_max.clamp(1, INFLIGHT_COMMITS_MAX),
            control_pending_bytes_max: log
                .pending_bytes_max
                .clamp(control_commit_bytes, LANE_PENDING_BYTES_MAX),
            data_pending_bytes_max: log
                .data_pending_bytes_max
                .clamp(entry_bytes_max, LANE_PENDING_BYTES_MAX),
            read_cache_bytes: log.tail_cache_bytes.min(JOURNAL_READ_CACHE_BYTES_MAX),
            read_ahead_bytes: log.tail_cache_bytes.min(JOURNAL_READ_CACHE_BYTES_MAX),
        };
        config.file_bytes =
            config.file_bytes.max(config.commit_span_max()).min(JOURNAL_FILE_BYTES_MAX);
        config
    }

    /// Checks every knob against its limit and the relations between them.
    ///
    /// # Errors
    /// The first violated rule.
    pub fn validate(&self) -> Result<(), JournalConfigError> {
        in_range("file_bytes", self.file_bytes, JOURNAL_FILE_BYTES_MIN, JOURNAL_FILE_BYTES_MAX)?;
        page_aligned("file_bytes", self.file_bytes)?;
        in_range("commit_bytes", self.commit_bytes, PAGE_BYTES, COMMIT_BYTES_MAX)?;
        page_aligned("commit_bytes", self.commit_bytes)?;
        let header = ENTRY_HEADER_BYTES as u64;
        in_range("control_commit_bytes", self.control_commit_bytes, 2 * header, COMMIT_BYTES_MAX)?;
        if self.control_commit_bytes >= self.commit_bytes {
            return Err(JournalConfigError::ControlNotBelowCommit {
                control: self.control_commit_bytes,
                commit: self.commit_bytes,
            });
        }
        in_range("entry_bytes_max", self.entry_bytes_max, 2 * header, ENTRY_BYTES_MAX)?;
        in_range(
            "inflight_commits_max",
            self.inflight_commits_max as u64,
            1,
            INFLIGHT_COMMITS_MAX as u64,
        )?;
        for (field, value, entry_bytes) in [
            (
                "control_pending_bytes_max",
                self.control_pending_bytes_max,
                self.control_commit_bytes,
            ),
            ("data_pending_bytes_max", self.data_pending_bytes_max, self.entry_bytes_max),
        ] {
            in_range(field, value, 1, LANE_PENDING_BYTES_MAX)?;
            if value < entry_bytes {
                return Err(JournalConfigError::PendingTooSmall { field, value, entry_bytes });
            }
        }
        in_range("read_cache_bytes", self.read_cache_bytes, 0, JOURNAL_READ_CACHE_BYTES_MAX)?;
        in_range("read_ahead_bytes", self.read_ahead_bytes, 0, JOURNAL_READ_CACHE_BYTES_MAX)?;
        let commit_span_bytes = self.commit_span_max();
        if commit_span_bytes > self.file_bytes {
            return Err(JournalConfigError::FileTooSmall {
                file_bytes: self.file_bytes,
                commit_span_bytes,
            });
        }
        Ok(())
    }

    /// Pages of the largest commit: at most `control_commit_bytes` of
    /// control, then data up to `commit_bytes` in total or one entry of
    /// `entry_bytes_max`, and a filler.
    pub fn commit_span_max(&self) -> u64 {
        let data = self.commit_bytes.max(self.control_commit_bytes + self.entry_bytes_max);
        // `commit_span` is not monotonic (an aligned total needs no filler),
        // so bound every total up to `data`.
        page_ceil(data + ENTRY_HEADER_BYTES as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_journal_of_partitions_takes_their_largest_control_batch() {
        // Goal: a journal built from a partition's log settings is valid and accepts every
        // control batch a partition may append (a claim or fence of the most events), for
        // the default settings and for the tests' small ones. Method: validate both and
        // compare the control entry bound with the largest control batch plus its header.
        use crate::limits::{CONTROL_BATCH_EVENTS_MAX, CONTROL_BATCH_OVERHEAD_BYTES};
        let largest = CONTROL_BATCH_OVERHEAD_BYTES
            + CONTROL_BATCH_EVENTS_MAX as u64 * (crate::queue::CLAIMED_EVENT_BYTES as u64 + 8)
            + ENTRY_HEADER_BYTES as u64;
        let small = crate::log::LogConfig {
            segment_bytes: 256 << 10,
            commit_bytes: 16 << 10,
            ..crate::log::LogConfig::default()
        };
        for log in [crate::log::LogConfig::default(), small] {
            let config = JournalConfig::for_partitions(&log);
            config.validate().unwrap();
            assert!(config.control_commit_bytes >= largest, "{config:?}");
        }
    }

    #[test]
    fn the_default_is_valid_and_bad_knobs_are_named() {
        // Goal: defaults pass; each broken relation is reported by name.
        JournalConfig::default().validate().unwrap();
        let control_too_big = JournalConfig { control_commit_bytes: 1 << 20, ..Default::default() };
        assert!(matches!(
            control_too_big.validate(),
            Err(JournalConfigError::ControlNotBelowCommit { .. })
        ));
        let small_file = JournalConfig { file_bytes: 64 << 10, ..Default::default() };
        assert!(matches!(small_file.validate(), Err(JournalConfigError::FileTooSmall { .. })));
        let no_room = JournalConfig { data_pending_bytes_max: 4096, ..Default::default() };
        let error = no_room.validate().unwrap_err();
        assert!(error.to_string().contains("data_pending_bytes_max"), "{error}");
    }
}
