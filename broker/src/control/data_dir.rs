//! The data directory's process-level files: `LOCK`, `secret` and `format`.
//!
//! Owns exclusive use of a data directory ([`DataDirLock`]: an `flock` on
//! `DATA_DIR/LOCK`, held for the life of the process, with the holder's pid
//! written inside so a second broker can say who holds it) and the broker
//! secret ([`BrokerSecret`]: 32 random bytes in `DATA_DIR/secret`, created
//! once, used later to MAC delivery tokens), and the directory's format
//! record ([`DataDirFormat`]: `DATA_DIR/format`, the log layout and the
//! shard count, written when the directory is created and checked at every
//! later start: a directory of the retired per-partition segment layout is
//! refused with what to do). It does not know about partitions or journals.
//!
//! Why the lock matters beyond the files: glommio's `TcpListener` always sets
//! SO_REUSEPORT, so a second broker on the same ports would bind silently and
//! steal half the connections. One broker per data directory, enforced here.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::limits::{FORMAT_FILE_READ_BYTES_MAX, LOCK_FILE_READ_BYTES_MAX};
use rand::TryRngCore;
use thiserror::Error;

/// How a data directory keeps its logs, as its format record names it.
/// Only [`LogLayout::Journal`] is started; the retired per-partition
/// segment layout is recognised so that such a directory is refused with
/// what to do, not misread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogLayout {
    /// Each partition its own segment log in its directory (retired).
    Segments,
    /// One journal per shard shared by every partition of the shard.
    Journal,
}

impl LogLayout {
    /// The name in the format record.
    pub fn as_str(self) -> &'static str {
        match self {
            LogLayout::Segments => "segments",
            LogLayout::Journal => "journal",
        }
    }
}

impl std::fmt::Display for LogLayout {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str(self.as_str())
    }
}

impl std::str::FromStr for LogLayout {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "segments" => Ok(LogLayout::Segments),
            "journal" => Ok(LogLayout::Journal),
            other => Err(format!("expected `journal` (or the retired `segments`), got `{other}`")),
        }
    }
}

/// Name of the lock file inside the data directory.
pub const LOCK_FILE_NAME: &str = "LOCK";
/// Name of the secret file inside the data directory.
pub const SECRET_FILE_NAME: &str = "secret";
/// Name of the format record inside the data directory.
pub const FORMAT_FILE_NAME: &str = "format";
/// Length of the broker secret.
pub const SECRET_BYTES: usize = 32;

/// What can go wrong with the data directory's own files.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum DataDirError {
    #[error(
        "data directory {dir} is locked by another spoold (pid {}); \
         two brokers must not share a data directory or ports",
        holder_pid.map_or_else(|| "unknown".to_owned(), |pid| pid.to_string())
    )]
    Locked { dir: PathBuf, holder_pid: Option<u32> },
    #[error("{op} {path}: {source}")]
    Io { op: &'static str, path: PathBuf, source: std::io::Error },
    #[error("broker secret {path} has {len_bytes} bytes, expected {SECRET_BYTES}")]
    SecretWrongSize { path: PathBuf, len_bytes: u64 },
    #[error("no randomness from the OS for the broker secret: {0}")]
    Random(String),
    #[error(
        "data directory {dir} holds the per-partition segment log layout ({why}), which this \
         spoold no longer reads: every log is now one journal per shard. Drain its queues with \
         the spoold release that wrote it (or keep running that release on it), and start this \
         one with a new data directory (--data-dir)"
    )]
    SegmentLayout { dir: PathBuf, why: &'static str },
    #[error(
        "data directory {dir} holds one journal per shard for {recorded} shards; it cannot be \
         started with {configured} shards (start it with --cores {recorded})"
    )]
    ShardCountMismatch { dir: PathBuf, recorded: u16, configured: u16 },
    #[error("format record {path} is not valid: {reason}")]
    FormatInvalid { path: PathBuf, reason: String },
}

impl DataDirError {
    /// Whether the data is fine and only the flags do not fit it.
    pub fn is_config_mismatch(&self) -> bool {
        matches!(self, DataDirError::SegmentLayout { .. } | DataDirError::ShardCountMismatch { .. })
    }
}

fn io_error<'a>(
    op: &'static str,
    path: &'a Path,
) -> impl FnOnce(std::io::Error) -> DataDirError + 'a {
    move |source| DataDirError::Io { op, path: path.to_owned(), source }
}

/// Exclusive use of a data directory for as long as this value lives.
#[derive(Debug)]
pub struct DataDirLock {
    dir: PathBuf,
    // Keeping the file open keeps the flock; closing it (drop) releases it.
    _file: File,
}

impl DataDirLock {
    /// Creates `dir` if needed, takes an exclusive non-blocking `flock` on
    /// `dir/LOCK` and writes our pid into it.
    ///
    /// # Errors
    /// [`DataDirError::Locked`] (with the holder's pid when readable) if
    /// another process (or another open in this process) holds it; `Io` for
    /// anything else.
    pub fn acquire(dir: &Path) -> Result<DataDirLock, DataDirError> {
        create_dir_durable(dir)?;
        // Every partition, segment and checkpoint path is derived from
        // `dir()`, so resolving it here, once, makes all of them absolute:
        // glommio 0.9's `Directory::open` fails with EBADF on a relative
        // path, which once broke the default `./spool-data`.
        let dir = &std::fs::canonicalize(dir).map_err(io_error("resolve data directory", dir))?;
        let path = dir.join(LOCK_FILE_NAME);
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o644)
            .open(&path)
            .map_err(io_error("open lock file", &path))?;
        // SAFETY: flock on an fd we own; no memory is passed.
        let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if rc != 0 {
            let error = std::io::Error::last_os_error();
            if error.raw_os_error() == Some(libc::EWOULDBLOCK) {
                return Err(DataDirError::Locked {
                    dir: dir.to_owned(),
                    holder_pid: read_holder_pid(&mut file),
                });
            }
            return Err(DataDirError::Io { op: "flock", path, source: error });
        }
        file.set_len(0).map_err(io_error("truncate lock file", &path))?;
        file.seek(SeekFrom::Start(0)).map_err(io_error("seek lock file", &path))?;
        writeln!(file, "{}", std::process::id()).map_err(io_error("write lock file", &path))?;
        file.sync_data().map_err(io_error("sync lock file", &path))?;
        Ok(DataDirLock { dir: dir.to_owned(), _file: file })
    }

    /// The data directory, absolute and canonical (symlinks resolved),
    /// whatever form the caller named it in.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

/// `std::fs::create_dir_all`, then an fsync of the parent of every
/// directory it created, so the data directory's name survives a crash
/// (files in it are synced with it as their parent).
fn create_dir_durable(dir: &Path) -> Result<(), DataDirError> {
    let mut missing: Vec<&Path> = dir
        .ancestors()
        .filter(|ancestor| !ancestor.as_os_str().is_empty())
        .take_while(|ancestor| !ancestor.is_dir())
        .collect();
    std::fs::create_dir_all(dir).map_err(io_error("create data directory", dir))?;
    missing.reverse();
    for created in missing {
        let parent = match created.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => parent,
            _ => Path::new("."),
        };
        File::open(parent)
            .and_then(|parent| parent.sync_all())
            .map_err(io_error("fsync parent of the data directory", parent))?;
    }
    Ok(())
}

fn read_holder_pid(file: &mut File) -> Option<u32> {
    let mut text = String::new();
    file.seek(SeekFrom::Start(0)).ok()?;
    file.take(LOCK_FILE_READ_BYTES_MAX).read_to_string(&mut text).ok()?;
    text.trim().parse().ok()
}

/// What a data directory was created as: its log layout and, for the
/// journal layout, its shard count (each shard's partitions live in that
/// shard's journal, so a restart must have the same shards).
///
/// `DATA_DIR/format` holds it as text lines `log_layout = journal` and
/// `shards = 2`, written once when the directory is created, like the
/// secret (temporary name, fsync, rename, directory fsync). A record of
/// `log_layout = segments` (no shard count), or a directory written before
/// the record existed (it has a secret but no record), is of the retired
/// segment layout and is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DataDirFormat {
    pub log_layout: LogLayout,
    /// The shard count of a journal directory (`None` for segments).
    pub shards: Option<u16>,
}

impl DataDirFormat {
    /// The format of a new directory for `shards` shards.
    pub fn journal(shards: u16) -> DataDirFormat {
        DataDirFormat { log_layout: LogLayout::Journal, shards: Some(shards) }
    }

    fn encode(self) -> String {
        let mut text = format!("log_layout = {}\n", self.log_layout);
        if let Some(shards) = self.shards {
            text.push_str(&format!("shards = {shards}\n"));
        }
        text
    }

    fn decode(text: &str) -> Result<DataDirFormat, String> {
        let mut layout = None;
        let mut shards = None;
        for line in text.lines().map(str::trim).filter(|line| !line.is_empty()) {
            let (key, value) = line
                .split_once('=')
                .ok_or_else(|| format!("line {line:?} is not `key = value`"))?;
            match key.trim() {
                "log_layout" => layout = Some(value.trim().parse::<LogLayout>()?),
                "shards" => {
                    let count = value
                        .trim()
                        .parse::<u16>()
                        .map_err(|error| format!("shards {value:?}: {error}"))?;
                    shards = Some(count);
                }
                other => return Err(format!("unknown key {other:?}")),
            }
        }
        let log_layout = layout.ok_or("no log_layout")?;
        match (log_layout, shards) {
            (LogLayout::Journal, None) => Err("the journal layout records no shard count".into()),
            (LogLayout::Journal, Some(0)) => Err("shards = 0".into()),
            (LogLayout::Segments, Some(_)) => {
                Err("the segment layout records a shard count".into())
            }
            _ => Ok(DataDirFormat { log_layout, shards }),
        }
    }

    /// Reads the record of the locked directory, or writes one of the
    /// journal layout for `shards` when the directory is new, then checks
    /// that the broker may start it with `shards`. Call before the secret
    /// is created: a directory without a secret is new.
    ///
    /// # Errors
    /// [`DataDirError::SegmentLayout`] for a directory of the retired
    /// segment layout (recorded so, or written before the record existed);
    /// [`DataDirError::ShardCountMismatch`] naming both counts;
    /// [`DataDirError::FormatInvalid`] for a damaged record; `Io`.
    pub fn load_or_create(lock: &DataDirLock, shards: u16) -> Result<DataDirFormat, DataDirError> {
        let dir = lock.dir();
        let path = dir.join(FORMAT_FILE_NAME);
        let recorded = match File::open(&path) {
            Ok(file) => {
                let mut text = String::new();
                file.take(FORMAT_FILE_READ_BYTES_MAX)
                    .read_to_string(&mut text)
                    .map_err(io_error("read format record", &path))?;
                DataDirFormat::decode(&text)
                    .map_err(|reason| DataDirError::FormatInvalid { path: path.clone(), reason })?
            }
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                if dir.join(SECRET_FILE_NAME).exists() {
                    return Err(DataDirError::SegmentLayout {
                        dir: dir.to_owned(),
                        why: "it has a broker secret but no format record",
                    });
                }
                let format = DataDirFormat::journal(shards);
                write_durable(dir, FORMAT_FILE_NAME, format.encode().as_bytes(), 0o644)?;
                tracing::info!(path = %path.display(), log_layout = %format.log_layout,
                    shards = ?format.shards, "recorded the data directory's format");
                format
            }
            Err(source) => return Err(DataDirError::Io { op: "open format record", path, source }),
        };
        if recorded.log_layout == LogLayout::Segments {
            return Err(DataDirError::SegmentLayout {
                dir: dir.to_owned(),
                why: "its format record says log_layout = segments",
            });
        }
        if let Some(recorded_shards) = recorded.shards {
            if recorded_shards != shards {
                return Err(DataDirError::ShardCountMismatch {
                    dir: dir.to_owned(),
                    recorded: recorded_shards,
                    configured: shards,
                });
            }
        }
        Ok(recorded)
    }
}

/// Writes `bytes` as `dir/name` so that a crash leaves the old file or the
/// whole new one: a temporary name with `mode`, fsync, rename, directory
/// fsync.
fn write_durable(dir: &Path, name: &str, bytes: &[u8], mode: u32) -> Result<(), DataDirError> {
    let path = dir.join(name);
    let temp_path = dir.join(format!("{name}.tmp"));
    let mut file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(&temp_path)
        .map_err(io_error("create", &temp_path))?;
    // A leftover temp file from a crash keeps its old mode.
    file.set_permissions(std::fs::Permissions::from_mode(mode))
        .map_err(io_error("chmod", &temp_path))?;
    file.write_all(bytes).map_err(io_error("write", &temp_path))?;
    file.sync_all().map_err(io_error("fsync", &temp_path))?;
    drop(file);
    std::fs::rename(&temp_path, &path).map_err(io_error("rename", &path))?;
    File::open(dir)
        .and_then(|dir_file| dir_file.sync_all())
        .map_err(io_error("fsync data directory", dir))
}

/// The broker's secret key. `Debug` does not print it.
#[derive(Clone, PartialEq, Eq)]
pub struct BrokerSecret([u8; SECRET_BYTES]);

impl std::fmt::Debug for BrokerSecret {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str("BrokerSecret(<redacted>)")
    }
}

impl BrokerSecret {
    /// Loads `dir/secret`, or creates it on first start: 32 bytes from the
    /// OS, mode 0600, written to a temporary name, fsynced, renamed into
    /// place and the directory fsynced, so a crash leaves either no secret or
    /// a whole one. Callers hold the [`DataDirLock`], so nobody races us.
    ///
    /// # Errors
    /// [`DataDirError::SecretWrongSize`] if the file exists with another
    /// length (never silently replaced: tokens depend on it); `Io`/`Random`.
    pub fn load_or_create(lock: &DataDirLock) -> Result<BrokerSecret, DataDirError> {
        let dir = lock.dir();
        let path = dir.join(SECRET_FILE_NAME);
        match File::open(&path) {
            Ok(file) => return Self::read(file, &path),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => return Err(DataDirError::Io { op: "open secret", path, source }),
        }
        let mut bytes = [0u8; SECRET_BYTES];
        rand::rngs::OsRng
            .try_fill_bytes(&mut bytes)
            .map_err(|error| DataDirError::Random(error.to_string()))?;
        write_durable(dir, SECRET_FILE_NAME, &bytes, 0o600)?;
        tracing::info!(path = %path.display(), "created broker secret");
        Ok(BrokerSecret(bytes))
    }

    /// Loads a cluster's secret from `path` (`cluster.secret_file`): the
    /// same bytes on every node, so a delivery token verifies on whichever
    /// replica leads. Never created here: every node must read one file.
    ///
    /// # Errors
    /// [`DataDirError::SecretWrongSize`] unless it holds exactly
    /// [`SECRET_BYTES`] bytes; `Io` when it cannot be read.
    pub fn load_cluster(path: &Path) -> Result<BrokerSecret, DataDirError> {
        let file = File::open(path).map_err(io_error("open cluster secret", path))?;
        Self::read(file, path)
    }

    fn read(file: File, path: &Path) -> Result<BrokerSecret, DataDirError> {
        let len_bytes = file.metadata().map_err(io_error("stat secret", path))?.len();
        if len_bytes != SECRET_BYTES as u64 {
            return Err(DataDirError::SecretWrongSize { path: path.to_owned(), len_bytes });
        }
        let mut bytes = [0u8; SECRET_BYTES];
        let mut reader = file;
        reader.read_exact(&mut bytes).map_err(io_error("read secret", path))?;
        Ok(BrokerSecret(bytes))
    }

    pub fn as_bytes(&self) -> &[u8; SECRET_BYTES] {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: a second lock on the same directory fails, names the dir and our
    // pid, and works again once the first is dropped. Method: flock conflicts
    // between two opens even in one process.
    #[test]
    fn second_lock_fails_with_holder_pid_until_released() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        let first = DataDirLock::acquire(&data).unwrap();
        match DataDirLock::acquire(&data) {
            Err(DataDirError::Locked { dir: locked_dir, holder_pid }) => {
                assert_eq!(locked_dir, data);
                assert_eq!(holder_pid, Some(std::process::id()));
            }
            other => panic!("expected Locked, got {other:?}"),
        }
        drop(first);
        DataDirLock::acquire(&data).unwrap();
    }

    // Goal: a relative data directory (the default `./spool-data`) is
    // resolved once to an absolute path, so nothing derived from it reaches
    // glommio relative. Method: chdir into a temp dir (nextest runs each
    // test in its own process), lock "./data", compare with the canonical
    // absolute path.
    #[test]
    fn relative_data_dir_resolves_to_absolute() {
        let dir = tempfile::tempdir().unwrap();
        std::env::set_current_dir(dir.path()).unwrap();
        let lock = DataDirLock::acquire(Path::new("./data")).unwrap();
        assert!(lock.dir().is_absolute(), "{}", lock.dir().display());
        assert_eq!(lock.dir(), std::fs::canonicalize(dir.path()).unwrap().join("data"));
        assert!(lock.dir().join(LOCK_FILE_NAME).exists());
    }

    // Goal: the secret is created once (0600, 32 bytes) and then reloaded
    // unchanged. Method: load twice, compare bytes and file mode.
    #[test]
    fn secret_created_once_then_reloaded() {
        let dir = tempfile::tempdir().unwrap();
        let lock = DataDirLock::acquire(dir.path()).unwrap();
        let created = BrokerSecret::load_or_create(&lock).unwrap();
        let loaded = BrokerSecret::load_or_create(&lock).unwrap();
        assert_eq!(created, loaded);
        assert_ne!(created.as_bytes(), &[0u8; SECRET_BYTES]);
        let meta = std::fs::metadata(dir.path().join(SECRET_FILE_NAME)).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        assert_eq!(meta.len(), SECRET_BYTES as u64);
        assert!(!format!("{created:?}").contains(&format!("{}", created.as_bytes()[0])));
    }

    // Goal: a new directory records the journal layout and its shard
    // count; a later start with another shard count is refused naming both;
    // a directory of the retired segment layout (recorded so, or written
    // before the record existed) is refused saying what to do, and nothing
    // in it is changed. Method: create, reopen with each mismatch, a record
    // of `segments`, and a directory holding only a secret.
    #[test]
    fn format_is_recorded_at_creation_and_enforced() {
        let dir = tempfile::tempdir().unwrap();
        let lock = DataDirLock::acquire(dir.path()).unwrap();
        let created = DataDirFormat::load_or_create(&lock, 2).unwrap();
        assert_eq!(created, DataDirFormat { log_layout: LogLayout::Journal, shards: Some(2) });
        BrokerSecret::load_or_create(&lock).unwrap();
        assert_eq!(DataDirFormat::load_or_create(&lock, 2).unwrap(), created);
        let error = DataDirFormat::load_or_create(&lock, 3).unwrap_err();
        assert!(error.is_config_mismatch());
        let text = error.to_string();
        assert!(text.contains("for 2 shards") && text.contains("with 3 shards"), "{text}");
        assert!(matches!(
            error,
            DataDirError::ShardCountMismatch { recorded: 2, configured: 3, .. }
        ));
        // A record of the retired layout.
        let format_path = dir.path().join(FORMAT_FILE_NAME);
        std::fs::write(&format_path, "log_layout = segments\n").unwrap();
        let error = DataDirFormat::load_or_create(&lock, 2).unwrap_err();
        let text = error.to_string();
        assert!(matches!(error, DataDirError::SegmentLayout { .. }), "{error}");
        assert!(
            text.contains("segment log layout") && text.contains("new data directory"),
            "{text}"
        );
        assert_eq!(std::fs::read_to_string(&format_path).unwrap(), "log_layout = segments\n");
        drop(lock);

        // Written before the record: a secret and no format file.
        let old = tempfile::tempdir().unwrap();
        let lock = DataDirLock::acquire(old.path()).unwrap();
        BrokerSecret::load_or_create(&lock).unwrap();
        let error = DataDirFormat::load_or_create(&lock, 1).unwrap_err();
        assert!(matches!(error, DataDirError::SegmentLayout { .. }), "{error}");
        assert!(!old.path().join(FORMAT_FILE_NAME).exists(), "nothing written");
        std::fs::write(old.path().join(FORMAT_FILE_NAME), "log_layout = tape\n").unwrap();
        let error = DataDirFormat::load_or_create(&lock, 1).unwrap_err();
        assert!(matches!(error, DataDirError::FormatInvalid { .. }), "{error}");
    }

    // Goal: a secret of the wrong size is a typed error, never replaced.
    // Method: write 31 bytes, load, check the error and that the file stays.
    #[test]
    fn wrong_size_secret_is_an_error_and_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let lock = DataDirLock::acquire(dir.path()).unwrap();
        let path = dir.path().join(SECRET_FILE_NAME);
        std::fs::write(&path, [7u8; 31]).unwrap();
        match BrokerSecret::load_or_create(&lock) {
            Err(DataDirError::SecretWrongSize { len_bytes: 31, path: error_path }) => {
                assert_eq!(error_path, path)
            }
            other => panic!("expected SecretWrongSize, got {other:?}"),
        }
        assert_eq!(std::fs::read(&path).unwrap(), vec![7u8; 31]);
    }
}
