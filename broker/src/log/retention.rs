//! Retention: delete whole sealed segments below a watermark the owner
//! computes (oldest unacked offset, checkpoint, audit window — DESIGN §3).
//! The active segment is never deleted; the directory is synced after.
//! The tail cache is trimmed the same way, in memory only: commits whose
//! every record is below the oldest live one are never read again, and so
//! is the read-back of the last file read once all of it is below.

use super::disk::failpoint;
use super::error::LogError;
use super::handle::Log;
use super::layout::index_path;
use super::Offset;
use crate::io::{IoOp, Storage};

impl<S: Storage> Log<S> {
    /// Drops the cached commits whose every record is below `watermark`
    /// (from the oldest; the cache stays one contiguous run) and returns the
    /// bytes freed. No I/O: reads below the cache go to the disk as before.
    pub fn trim_cache_below(&self, watermark: Offset) -> u64 {
        let mut state = self.shared.state.borrow_mut();
        let mut freed = 0;
        while state.tail.front().is_some_and(|cached| cached.next_offset <= watermark.0) {
            if let Some(evicted) = state.tail.pop_front() {
                freed += evicted.buf.as_ref().as_ref().len() as u64;
            }
        }
        state.tail_bytes = state.tail_bytes.saturating_sub(freed);
        if state.read_back.last().is_some_and(|batch| batch.header.next_offset() <= watermark.0) {
            freed += state.read_back_bytes;
            state.read_back = Vec::new();
            state.read_back_bytes = 0;
        }
        freed
    }

    /// Bytes the tail cache and the read-back hold (the memory of their
    /// buffers).
    pub fn cached_bytes(&self) -> u64 {
        let state = self.shared.state.borrow();
        state.tail_bytes + state.read_back_bytes
    }

    /// Deletes every sealed segment whose every offset is below `watermark`,
    /// oldest first, and returns how many were deleted. Reads below the new
    /// start then fail with [`LogError::OffsetOutOfRange`].
    ///
    /// # Errors
    /// [`LogError::Io`] when a remove or the directory sync fails (the
    /// segments are already dropped from memory; files left behind reappear
    /// as the log start on the next open, which is harmless).
    pub async fn delete_below(&self, watermark: Offset) -> Result<usize, LogError> {
        let doomed = {
            let mut state = self.shared.state.borrow_mut();
            let mut doomed = Vec::new();
            while state.segments.len() > 1 && state.segments[0].next_offset.get() <= watermark.0 {
                let segment = state.segments.remove(0);
                state.seal_queue.retain(|sealed| sealed.base != segment.base);
                doomed.push(segment);
            }
            doomed
        };
        if doomed.is_empty() {
            return Ok(0);
        }
        let storage = &self.shared.storage;
        for segment in &doomed {
            failpoint("log.retention.remove", IoOp::Remove, &segment.path, None)?;
            storage.remove(&segment.path).await?;
            if let Err(error) = storage.remove(&index_path(&self.shared.dir, segment.base)).await {
                if error.source.kind() != std::io::ErrorKind::NotFound {
                    return Err(error.into());
                }
            }
        }
        failpoint("log.retention.dir_sync", IoOp::SyncDir, &self.shared.dir, None)?;
        storage.sync_dir(&self.shared.dir).await?;
        // Space came back: a preparation refused for lack of it may work now.
        self.retry_prepare();
        Ok(doomed.len())
    }
}
