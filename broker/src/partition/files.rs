//! Small side files of a partition directory: the leader epoch, the
//! checkpoint and the sealed dedupe generations it refers to
//! (`dedupe_files.rs`, magic "SPDG", value the generation's first offset).
//! All are replaced atomically (write a temporary file,
//! fdatasync, rename, sync the directory) through the storage seam, so a crash
//! leaves either the old or the new file, never a mix. A checkpoint streams
//! its payload through [`SideFileWriter`] (one write chunk in memory; the
//! header, which holds the payload's length and crc, is written last).
//!
//! Layout of every side file (little-endian), padded with zeros to whole pages:
//!
//! ```text
//! 0  4  magic ("SPEP" epoch, "SPCK" checkpoint, "SPDG" dedupe generation;
//!       "SPRS", a retired resume point, is never reused)
//! 4  4  format version (1)
//! 8  8  payload length in bytes
//! 16 8  value: the epoch, or the checkpoint's cursor (below)
//! 24 4  crc32c of the payload
//! 28 4  crc32c of bytes [0, 28)
//! 32 .. payload
//! ```
//!
//! The checkpoint's value and payload (`log.rs`): the value is the
//! journal position the shard's recovery must start from for this
//! partition (its scan start), and the payload is the control cursor `c_p`
//! (8 bytes, little-endian: the journal position where the control entries
//! the snapshot does not hold begin) followed by the snapshot, which
//! records the data offset it covers.

use std::path::{Path, PathBuf};
use std::rc::Rc;

use crate::io::{IoBuf, IoError, IoOp, Storage, StorageFile};
use crate::log::failpoint;

pub use crate::limits::SIDE_FILE_BYTES_MAX;
use crate::limits::{
    PAGE_BYTES, SIDE_READ_CHUNK_BYTES, SIDE_WRITE_CHUNK_BYTES, SIDE_WRITE_CHUNK_FIRST_BYTES,
};

pub(crate) const EPOCH_MAGIC: u32 = u32::from_le_bytes(*b"SPEP");
/// Magic of the checkpoint side file (for [`read_side_file`]).
pub const CHECKPOINT_MAGIC: u32 = u32::from_le_bytes(*b"SPCK");
const SIDE_FILE_VERSION: u32 = 1;
const SIDE_HEADER_BYTES: usize = 32;

/// Name of the leader-epoch side file in a partition directory.
pub const EPOCH_FILE: &str = "epoch";
/// Name of the checkpoint side file in a partition directory (benchmarks
/// delete it to measure a full replay).
pub const CHECKPOINT_FILE: &str = "checkpoint";
/// What is wrong with a side file.
#[derive(Debug, thiserror::Error)]
pub enum SideFileError {
    #[error(transparent)]
    Io(#[from] IoError),
    #[error("{path}: {reason}")]
    Invalid { path: PathBuf, reason: String },
}

/// A decoded side file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SideFile {
    pub value: u64,
    pub payload: Vec<u8>,
}

fn temp_name(name: &str) -> String {
    format!("{name}.tmp")
}

/// Writes `name` in `dir` atomically and durably.
///
/// # Errors
/// Any I/O error of the storage; the previous file (if any) is then intact.
pub async fn write_side_file<S: Storage>(
    storage: &S,
    dir: &Path,
    name: &str,
    magic: u32,
    value: u64,
    payload: &[u8],
) -> Result<(), IoError> {
    let mut writer = SideFileWriter::create(storage, dir, name).await?;
    writer.write(payload).await?;
    writer.finish(storage, magic, value).await
}

/// A side file written in pieces, for a payload that is never in memory
/// whole (a checkpoint): the payload streams through one write buffer into
/// a temporary file. The buffer starts at [`SIDE_WRITE_CHUNK_FIRST_BYTES`]
/// and doubles per chunk written, up to [`SIDE_WRITE_CHUNK_BYTES`], so the
/// checkpoint of a small partition holds (and zeroes) a few KiB, not a MiB,
/// and a large one still writes in large chunks; [`finish`] writes the
/// header (length and crc, known only at the end) into the first page,
/// fdatasyncs, renames over `name` and syncs the directory. Until the
/// rename the previous file is untouched, so a crash or an error at any
/// point leaves it usable; a temporary file left behind is removed by the
/// next writer.
///
/// [`finish`]: SideFileWriter::finish
pub struct SideFileWriter<F: StorageFile> {
    file: F,
    temp: PathBuf,
    dir: PathBuf,
    name: String,
    /// The chunk being filled: file bytes from `flushed` (`None` after a
    /// flush until more bytes come).
    buf: Option<F::Buf>,
    /// Size of the next chunk allocated.
    chunk: usize,
    filled: usize,
    flushed: u64,
    /// The first page as written (header zeroed), rewritten with the
    /// header by `finish`.
    first_page: Vec<u8>,
    payload_len: u64,
    crc: u32,
}

impl<F: StorageFile> SideFileWriter<F> {
    /// Opens a fresh temporary file for `name` in `dir`.
    ///
    /// # Errors
    /// Any I/O error of the storage.
    pub async fn create<S: Storage<File = F>>(
        storage: &S,
        dir: &Path,
        name: &str,
    ) -> Result<Self, IoError> {
        let temp = dir.join(temp_name(name));
        // A temporary file left by a crash may be longer than this one; start clean.
        let _ = storage.remove(&temp).await;
        let file = storage.open(&temp).await?;
        let mut buf = file.alloc_buf(SIDE_WRITE_CHUNK_FIRST_BYTES);
        buf.as_mut()[..SIDE_HEADER_BYTES].fill(0);
        Ok(Self {
            file,
            temp,
            dir: dir.to_path_buf(),
            name: name.to_owned(),
            buf: Some(buf),
            chunk: SIDE_WRITE_CHUNK_FIRST_BYTES,
            filled: SIDE_HEADER_BYTES,
            flushed: 0,
            first_page: Vec::new(),
            payload_len: 0,
            crc: 0,
        })
    }

    /// Payload bytes written so far.
    pub fn payload_len(&self) -> u64 {
        self.payload_len
    }

    /// Appends `bytes` to the payload; writes each chunk as it fills.
    ///
    /// # Errors
    /// Any I/O error of the storage.
    pub async fn write(&mut self, mut bytes: &[u8]) -> Result<(), IoError> {
        self.crc = crc32c::crc32c_append(self.crc, bytes);
        self.payload_len += bytes.len() as u64;
        while !bytes.is_empty() {
            let (file, chunk) = (&self.file, self.chunk);
            let buf = self.buf.get_or_insert_with(|| file.alloc_buf(chunk));
            let room = self.chunk - self.filled;
            let take = room.min(bytes.len());
            buf.as_mut()[self.filled..self.filled + take].copy_from_slice(&bytes[..take]);
            self.filled += take;
            bytes = &bytes[take..];
            if self.filled == self.chunk {
                self.flush().await?;
                self.chunk = (self.chunk * 2).min(SIDE_WRITE_CHUNK_BYTES);
            }
        }
        Ok(())
    }

    /// Writes the filled part of the chunk (zero-padded to whole pages).
    async fn flush(&mut self) -> Result<(), IoError> {
        if self.filled == 0 {
            return Ok(());
        }
        let Some(mut buf) = self.buf.take() else { return Ok(()) };
        let padded = self.filled.div_ceil(PAGE_BYTES as usize) * PAGE_BYTES as usize;
        buf.as_mut()[self.filled..padded].fill(0);
        buf.trim(padded);
        if self.flushed == 0 {
            self.first_page = buf.as_ref()[..PAGE_BYTES as usize].to_vec();
        }
        if cfg!(feature = "failpoints") {
            failpoint(
                &format!("{}.write", self.name),
                IoOp::Write,
                &self.temp,
                Some(self.flushed),
            )?;
        }
        self.file.write_at(Rc::new(buf), self.flushed).await?;
        self.flushed += padded as u64;
        self.filled = 0;
        Ok(())
    }

    /// Writes the rest and the header, makes the file durable and puts it
    /// in place of `name`.
    ///
    /// # Errors
    /// Any I/O error of the storage; the previous file is then intact.
    pub async fn finish<S: Storage<File = F>>(
        mut self,
        storage: &S,
        magic: u32,
        value: u64,
    ) -> Result<(), IoError> {
        self.flush().await?;
        let mut header = [0u8; SIDE_HEADER_BYTES];
        header[0..4].copy_from_slice(&magic.to_le_bytes());
        header[4..8].copy_from_slice(&SIDE_FILE_VERSION.to_le_bytes());
        header[8..16].copy_from_slice(&self.payload_len.to_le_bytes());
        header[16..24].copy_from_slice(&value.to_le_bytes());
        header[24..28].copy_from_slice(&self.crc.to_le_bytes());
        let header_crc = crc32c::crc32c(&header[..28]);
        header[28..32].copy_from_slice(&header_crc.to_le_bytes());
        let mut page = self.file.alloc_buf(PAGE_BYTES as usize);
        page.as_mut().copy_from_slice(&self.first_page);
        page.as_mut()[..SIDE_HEADER_BYTES].copy_from_slice(&header);
        if cfg!(feature = "failpoints") {
            failpoint(&format!("{}.write", self.name), IoOp::Write, &self.temp, Some(0))?;
        }
        self.file.write_at(Rc::new(page), 0).await?;
        if cfg!(feature = "failpoints") {
            failpoint(&format!("{}.sync", self.name), IoOp::Sync, &self.temp, None)?;
        }
        self.file.fdatasync().await?;
        let Self { file, temp, dir, name, .. } = self;
        drop(file);
        if cfg!(feature = "failpoints") {
            failpoint(&format!("{name}.rename"), IoOp::Rename, &temp, None)?;
        }
        storage.rename(&temp, &dir.join(&name)).await?;
        if cfg!(feature = "failpoints") {
            failpoint(&format!("{name}.dir_sync"), IoOp::SyncDir, &dir, None)?;
        }
        storage.sync_dir(&dir).await?;
        Ok(())
    }
}

/// Checks a side file's header (its crc, magic, version); returns the
/// payload length it declares.
fn check_header(header: &[u8; SIDE_HEADER_BYTES], magic: u32) -> Result<u64, String> {
    let u32_at = |at: usize| {
        u32::from_le_bytes([header[at], header[at + 1], header[at + 2], header[at + 3]])
    };
    if u32_at(28) != crc32c::crc32c(&header[..28]) {
        return Err("header crc mismatch".to_owned());
    }
    if u32_at(0) != magic {
        return Err(format!("bad magic {:#010x}", u32_at(0)));
    }
    if u32_at(4) != SIDE_FILE_VERSION {
        return Err(format!("unsupported version {}", u32_at(4)));
    }
    let mut raw = [0u8; 8];
    raw.copy_from_slice(&header[8..16]);
    Ok(u64::from_le_bytes(raw))
}

/// Reads `name` in `dir`; `Ok(None)` when it does not exist.
///
/// # Errors
/// [`SideFileError::Invalid`] when the file exists but is damaged (bad magic,
/// version, length or crc), naming the file.
pub async fn read_side_file<S: Storage>(
    storage: &S,
    dir: &Path,
    name: &str,
    magic: u32,
) -> Result<Option<SideFile>, SideFileError> {
    let names = storage.list_dir(dir).await?;
    if !names.iter().any(|existing| existing == name) {
        return Ok(None);
    }
    let path = dir.join(name);
    let invalid = |reason: String| SideFileError::Invalid { path: path.clone(), reason };
    let file = storage.open(&path).await?;
    let len = file.len_bytes().await?;
    if len > SIDE_FILE_BYTES_MAX {
        return Err(invalid(format!("{len} bytes is more than {SIDE_FILE_BYTES_MAX}")));
    }
    // The header arrives with the first read; the payload is copied once,
    // straight from each read buffer into a vector of its exact size.
    let mut header = [0u8; SIDE_HEADER_BYTES];
    let mut payload: Vec<u8> = Vec::new();
    let mut payload_len = 0u64;
    let mut pos = 0u64;
    while pos < len {
        let want = ((len - pos) as usize).min(SIDE_READ_CHUNK_BYTES);
        let want = want.div_ceil(PAGE_BYTES as usize) * PAGE_BYTES as usize;
        let chunk = file.read_at(pos, want).await?;
        if chunk.is_empty() {
            break;
        }
        let mut skip = 0usize;
        if pos == 0 {
            if chunk.len() < SIDE_HEADER_BYTES {
                return Err(invalid(format!("only {} bytes", chunk.len())));
            }
            header.copy_from_slice(&chunk[..SIDE_HEADER_BYTES]);
            payload_len = check_header(&header, magic).map_err(invalid)?;
            if (SIDE_HEADER_BYTES as u64).saturating_add(payload_len) > len {
                return Err(invalid(format!(
                    "payload of {payload_len} bytes runs past the file end"
                )));
            }
            payload.reserve_exact(payload_len as usize);
            skip = SIDE_HEADER_BYTES;
        }
        let room = payload_len as usize - payload.len();
        let take = (chunk.len() - skip).min(room);
        payload.extend_from_slice(&chunk[skip..skip + take]);
        pos += chunk.len() as u64;
    }
    if pos == 0 {
        return Err(invalid("only 0 bytes".to_owned()));
    }
    if payload.len() as u64 != payload_len {
        return Err(invalid(format!("payload of {payload_len} bytes runs past the file end")));
    }
    let stored_crc = u32::from_le_bytes([header[24], header[25], header[26], header[27]]);
    if stored_crc != crc32c::crc32c(&payload) {
        return Err(invalid("payload crc mismatch".to_owned()));
    }
    let mut value = [0u8; 8];
    value.copy_from_slice(&header[16..24]);
    Ok(Some(SideFile { value: u64::from_le_bytes(value), payload }))
}
