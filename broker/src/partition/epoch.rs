//! The leader epoch at open: it never goes backwards.
//!
//! A partition opens at `max(epoch file, highest epoch in the log) + 1`.
//! The epoch file is written (durably) before the log takes any append, so
//! normally it is already the maximum; but a lost or older epoch file (a
//! restored copy, a file removed by hand) would otherwise restart the epoch
//! below batches the log already holds, and tokens and fences of the old
//! epochs would compare as current. Every batch header carries its epoch,
//! and recovery reports the highest it read; when that is not below the
//! epoch the file gave, the log is reopened at the higher epoch (the file is
//! rewritten first). Without an epoch file the whole log is scanned (no
//! checkpoint bound), so no segment's epochs go unread.

use std::path::Path;
use std::rc::Rc;

use super::files::{self, EPOCH_FILE, EPOCH_MAGIC};
use super::{LogCursor, PartitionError, PartitionLog};
use crate::io::Storage;
use crate::log::{FatalHandler, LogConfig, LogError, RecoveryReport, ResumePoint};

/// The opened log, what its recovery found, and the partition's new epoch
/// (durable in the epoch file before this returns).
pub(super) struct Opened<S: Storage> {
    pub log: PartitionLog<S>,
    pub report: RecoveryReport,
    pub epoch: u64,
}

/// The epoch the epoch file holds, 0 without one.
pub(super) async fn stored<S: Storage>(storage: &S, dir: &Path) -> Result<u64, PartitionError> {
    let previous = files::read_side_file(storage, dir, EPOCH_FILE, EPOCH_MAGIC).await?;
    Ok(previous.map_or(0, |file| file.value))
}

/// Makes `epoch` durable in the epoch file (before anything is appended or
/// any token issued) and returns it as a batch header's epoch.
pub(super) async fn persist<S: Storage>(
    storage: &S,
    dir: &Path,
    epoch: u64,
) -> Result<u32, PartitionError> {
    files::write_side_file(storage, dir, EPOCH_FILE, EPOCH_MAGIC, epoch, &[])
        .await
        .map_err(LogError::Io)?;
    u32::try_from(epoch)
        .map_err(|_| PartitionError::EpochExhausted { dir: dir.to_path_buf(), epoch })
}

/// Bumps and persists the leader epoch and opens the log at it; see the
/// module docs. `scan_from`: where a usable checkpoint's state ends;
/// `resume`: where the scan of the segment holding it may start (both
/// ignored without an epoch file).
pub(super) async fn open_log<S: Storage + Clone>(
    storage: &S,
    dir: &Path,
    log_config: LogConfig,
    fatal: Rc<dyn FatalHandler>,
    scan_from: Option<LogCursor>,
    resume: Option<ResumePoint>,
) -> Result<Opened<S>, PartitionError> {
    let previous = files::read_side_file(storage, dir, EPOCH_FILE, EPOCH_MAGIC).await?;
    // No epoch file: read every batch, so the highest epoch is seen.
    let scan_from = scan_from.filter(|_| previous.is_some());
    let mut epoch = previous.map_or(0, |file| file.value) + 1;
    loop {
        let log_epoch = persist(storage, dir, epoch).await?;
        let config = log_config.clone();
        let fatal = fatal.clone();
        let (log, report) = PartitionLog::open_segments(
            storage.clone(),
            dir,
            config,
            log_epoch,
            fatal,
            scan_from,
            resume.clone(),
        )
        .await?;
        let in_log = u64::from(report.highest_epoch);
        if in_log < epoch {
            return Ok(Opened { log, report, epoch });
        }
        tracing::warn!(dir = %dir.display(), file_epoch = epoch - 1, log_epoch = in_log,
            "the log holds a newer leader epoch than the epoch file; reopening past it");
        // Nothing was appended: the log's background never ran.
        drop(log);
        epoch = in_log + 1;
    }
}
