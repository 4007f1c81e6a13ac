//! Releasing journal files nobody needs any more: every file that lies
//! wholly below a position the owner names is removed, oldest first, and the
//! directory is synced.
//!
//! The owner (the shard) names the position: the lowest journal position
//! any of its partitions still needs, that is the lowest of each
//! partition's checkpoint cursor `c_p` (control entries before it are
//! folded into the checkpoint) and the position of its oldest data entry
//! still live (`docs/design/shard-journal.md` §6). The journal itself does
//! not know what is live; it only guarantees the mechanics:
//!
//! - only files wholly below the position go, and never the file commits
//!   are written to (the newest one), so nothing a later commit or a
//!   recovery from the position needs is touched;
//! - files go oldest first, so a crash part-way leaves a contiguous run of
//!   files that still starts at or below the position: recovery from the
//!   position finds its file, and the older survivors are simply released
//!   again;
//! - a position at or past the durable watermark is clamped to it: bytes
//!   not yet durable are never below what is released;
//! - reads of a released position answer [`JournalError::BelowOldestFile`],
//!   also when the read cache still held the commit.
//!
//! A failed remove or directory sync is returned, not retried here: the
//! file stays listed (a remove that did not happen) or its removal may not
//! survive a crash (a directory sync that failed). Either way nothing
//! durable is lost — the file only holds bytes below the position — and the
//! next release tries that file again.

use super::appender::Journal;
use super::error::JournalError;
use super::JournalPos;
use crate::io::{IoOp, Storage};
use crate::log::failpoint;

/// What one [`Journal::release_below`] removed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Released {
    /// Journal files removed.
    pub files: usize,
    /// Their size in bytes.
    pub bytes: u64,
    /// The journal position of the oldest file still held afterwards.
    pub oldest: JournalPos,
}

impl<S: Storage> Journal<S> {
    /// Removes every journal file that lies wholly below `pos` (clamped to
    /// the durable watermark), except the newest file, oldest first, then
    /// syncs the directory; see the module docs.
    ///
    /// # Errors
    /// [`JournalError::Io`] when a remove or the directory sync fails; the
    /// files removed before it are gone (and no longer listed), the rest
    /// stay for the next call.
    pub async fn release_below(&self, pos: JournalPos) -> Result<Released, JournalError> {
        let limit = pos.min(self.durable_position());
        let doomed: Vec<(u64, u64, std::path::PathBuf)> = {
            let state = self.shared.state.borrow();
            let bases: Vec<u64> = state.files.keys().copied().collect();
            bases
                .windows(2)
                .filter(|pair| pair[1] <= limit.0)
                .filter_map(|pair| {
                    state.files.get(&pair[0]).map(|slot| (pair[0], pair[1], slot.path.clone()))
                })
                .collect()
        };
        let mut released = Released { oldest: self.oldest_file(), ..Released::default() };
        if doomed.is_empty() {
            return Ok(released);
        }
        let storage = &self.shared.storage;
        for (base, end, path) in &doomed {
            // Unlisted first: a read that starts now answers BelowOldestFile
            // instead of opening a name that is about to disappear. A read
            // already holding the open file finishes on it.
            {
                let mut state = self.shared.state.borrow_mut();
                state.files.remove(base);
                while state.cache.front().is_some_and(|commit| commit.pos < *end) {
                    if let Some(commit) = state.cache.pop_front() {
                        state.cache_bytes = state
                            .cache_bytes
                            .saturating_sub(commit.buf.as_ref().as_ref().len() as u64);
                    }
                }
            }
            let removed = async {
                failpoint("journal.release.remove", IoOp::Remove, path, None)?;
                storage.remove(path).await
            };
            if let Err(error) = removed.await {
                if error.source.kind() != std::io::ErrorKind::NotFound {
                    // Still on disk: list it again so the next call retries.
                    self.relist(*base, path.clone());
                    return Err(error.into());
                }
            }
            released.files += 1;
            released.bytes += end - base;
        }
        failpoint("journal.release.dir_sync", IoOp::SyncDir, self.dir(), None)?;
        storage.sync_dir(self.dir()).await?;
        released.oldest = self.oldest_file();
        Ok(released)
    }

    /// The journal position of byte 0 of the oldest file still held.
    pub fn oldest_file(&self) -> JournalPos {
        JournalPos(self.shared.state.borrow().files.keys().next().copied().unwrap_or(0))
    }

    /// Journal files held (the newest, being written, included).
    pub fn file_count(&self) -> usize {
        self.shared.state.borrow().files.len()
    }

    /// The journal position of byte 0 of the file holding `pos`: the
    /// newest file that starts at or below it (`pos` itself when no file
    /// does). Two positions in the same file pin the same file.
    pub fn file_base(&self, pos: JournalPos) -> JournalPos {
        JournalPos(
            self.shared.state.borrow().files.range(..=pos.0).next_back().map_or(pos.0, |(b, _)| *b),
        )
    }

    /// The journal position of byte 0 of the file after the one starting
    /// at `base` (`None` when it is the newest, or not held).
    pub fn next_file(&self, base: JournalPos) -> Option<JournalPos> {
        let state = self.shared.state.borrow();
        if !state.files.contains_key(&base.0) {
            return None;
        }
        state.files.range(base.0 + 1..).next().map(|(next, _)| JournalPos(*next))
    }

    /// The journal position of byte 0 of the newest file (the one commits
    /// are written to).
    pub fn newest_file(&self) -> JournalPos {
        JournalPos(self.shared.state.borrow().files.keys().next_back().copied().unwrap_or(0))
    }

    fn relist(&self, base: u64, path: std::path::PathBuf) {
        self.shared
            .state
            .borrow_mut()
            .files
            .insert(base, super::read_cache::FileSlot { path, file: None, len_bytes: None });
    }
}
