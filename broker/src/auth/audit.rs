//! The audit log: one durable line per destructive operation (purge,
//! redrive, queue deletion, subscription creation and deletion), allowed
//! or refused (and per refused dry-run purge: an attempt without the
//! privilege), in `audit.log` in the data directory.
//!
//! Append-only JSON lines (`{"time_ms":…,"principal":…,"operation":…,
//! "queue":…,"subscription":…,"partition":…,"count":…,"outcome":…}`,
//! `subscription` only when one is named): each entry is one
//! `write` to a file opened with `O_APPEND` (so the shards' lines never
//! interleave), then `fdatasync`, before the request is answered. The file
//! is never rewritten or truncated by the broker. A line torn by a crash
//! can only be the last one; [`read_entries`] skips it.
//!
//! The writes are blocking `std::fs` calls: the caller runs
//! [`AuditLog::append`] off the shard's executor (`server::auth` hands it to
//! glommio's blocking pool), so the data path never waits on this file.
//! `spool audit` reads the file directly (it needs no running broker).

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

use serde::{Deserialize, Serialize};

/// The audit log's name inside the data directory.
pub const AUDIT_FILE_NAME: &str = "audit.log";

/// One audited operation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditEntry {
    /// Broker clock, Unix milliseconds, when the outcome was known.
    pub time_ms: u64,
    /// Who asked (`anonymous` while authentication is off).
    pub principal: String,
    /// `purge`, `redrive`, `delete_queue`, `resize_queue`,
    /// `create_subscription` or `delete_subscription`.
    pub operation: String,
    pub queue: String,
    /// The subscription a purge or redrive acted in, or the one created or
    /// deleted; absent (empty) for the queue's default subscription and for
    /// operations on the whole queue, so older lines read the same.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub subscription: String,
    /// The partition a purge or redrive acted on; none for a deletion.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition: Option<u32>,
    /// Messages purged or redriven; partitions removed by a deletion.
    pub count: u64,
    /// A dry-run purge (recorded only when it was refused).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub dry_run: bool,
    /// `ok`, or the stable error name the request was answered with
    /// (`PERMISSION_DENIED`, …).
    pub outcome: String,
}

/// The audit file of one data directory. Opened on the first append.
#[derive(Debug)]
pub struct AuditLog {
    path: PathBuf,
    file: Mutex<Option<File>>,
}

impl AuditLog {
    /// The audit log of `data_dir` (nothing is opened yet).
    pub fn new(data_dir: &Path) -> AuditLog {
        AuditLog { path: data_dir.join(AUDIT_FILE_NAME), file: Mutex::new(None) }
    }

    /// Where the file is.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends `entry` as one line and makes it durable (`fdatasync`; the
    /// directory is synced too when this append created the file).
    /// Blocking: call it off the executor.
    ///
    /// # Errors
    /// The open, write or sync failed; the entry may be lost, and a failed
    /// sync is never retried on the same handle (it is dropped).
    pub fn append(&self, entry: &AuditEntry) -> std::io::Result<()> {
        let mut line = serde_json::to_vec(entry).map_err(std::io::Error::other)?;
        line.push(b'\n');
        let mut file = self.file.lock().unwrap_or_else(PoisonError::into_inner);
        if file.is_none() {
            let existed = self.path.exists();
            let opened = OpenOptions::new().create(true).append(true).open(&self.path)?;
            if !existed {
                opened.sync_all()?;
                if let Some(parent) = self.path.parent() {
                    File::open(parent)?.sync_all()?;
                }
            }
            *file = Some(opened);
        }
        let outcome = match file.as_mut() {
            Some(handle) => handle.write_all(&line).and_then(|()| handle.sync_data()),
            None => Ok(()),
        };
        if outcome.is_err() {
            // After a failed write or sync the handle proves nothing more.
            *file = None;
        }
        outcome
    }
}

/// Every entry of the audit file at `path`, oldest first. A last line that
/// does not parse (torn by a crash mid-append) is skipped; any other bad
/// line is an error naming it.
///
/// # Errors
/// The file cannot be read, or a line before the last is not an entry.
pub fn read_entries(path: &Path) -> std::io::Result<Vec<AuditEntry>> {
    let text = std::fs::read_to_string(path)?;
    let lines: Vec<&str> = text.lines().filter(|line| !line.trim().is_empty()).collect();
    let mut entries = Vec::with_capacity(lines.len());
    for (index, line) in lines.iter().enumerate() {
        match serde_json::from_str::<AuditEntry>(line) {
            Ok(entry) => entries.push(entry),
            Err(_) if index + 1 == lines.len() && !text.ends_with('\n') => break,
            Err(error) => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("{}: line {}: {error}", path.display(), index + 1),
                ))
            }
        }
    }
    Ok(entries)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(count: u64) -> AuditEntry {
        AuditEntry {
            time_ms: 1_700_000_000_000,
            principal: "ops".to_owned(),
            operation: "purge".to_owned(),
            queue: "jobs".to_owned(),
            subscription: String::new(),
            partition: Some(1),
            count,
            dry_run: false,
            outcome: "ok".to_owned(),
        }
    }

    // Goal: entries append, survive a reopen, and a torn last line is
    // skipped while damage before it is refused. Method: a temp dir, two
    // logs on the same file, then a torn and a damaged file by hand.
    #[test]
    fn entries_append_durably_and_a_torn_tail_is_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let log = AuditLog::new(dir.path());
        log.append(&entry(3)).unwrap();
        AuditLog::new(dir.path()).append(&entry(4)).unwrap();
        log.append(&entry(5)).unwrap();
        let read = read_entries(log.path()).unwrap();
        assert_eq!(read, vec![entry(3), entry(4), entry(5)]);

        let mut torn = std::fs::read(log.path()).unwrap();
        torn.extend_from_slice(b"{\"time_ms\":17");
        std::fs::write(log.path(), &torn).unwrap();
        assert_eq!(read_entries(log.path()).unwrap().len(), 3);

        std::fs::write(log.path(), b"garbage\n{}\n").unwrap();
        assert!(read_entries(log.path()).is_err());
    }

    // Goal: an entry naming a subscription keeps its name through the
    // file, and one for the default writes the line it always wrote (no
    // `subscription` key); method: both appended and read back.
    #[test]
    fn a_subscription_is_named_only_when_there_is_one() {
        let dir = tempfile::tempdir().unwrap();
        let log = AuditLog::new(dir.path());
        let named = AuditEntry { subscription: "audit".to_owned(), ..entry(2) };
        log.append(&entry(1)).unwrap();
        log.append(&named).unwrap();
        assert_eq!(read_entries(log.path()).unwrap(), vec![entry(1), named]);
        let text = std::fs::read_to_string(log.path()).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert!(!lines[0].contains("subscription"), "{}", lines[0]);
        assert!(lines[1].contains(r#""subscription":"audit""#), "{}", lines[1]);
    }
}
