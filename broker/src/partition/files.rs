//! Small side files of a partition directory: the leader epoch and the
//! checkpoint. Both are replaced atomically (write a temporary file,
//! fdatasync, rename, sync the directory) through the storage seam, so a crash
//! leaves either the old or the new file, never a mix.
//!
//! Layout of both files (little-endian), padded with zeros to whole pages:
//!
//! ```text
//! 0  4  magic ("SPEP" epoch, "SPCK" checkpoint)
//! 4  4  format version (1)
//! 8  8  payload length in bytes
//! 16 8  value: the epoch, or the offset the checkpoint covers
//! 24 4  crc32c of the payload
//! 28 4  crc32c of bytes [0, 28)
//! 32 .. payload
//! ```

use std::path::{Path, PathBuf};
use std::rc::Rc;

use crate::io::{IoError, IoOp, Storage, StorageFile};
use crate::log::failpoint;

use crate::limits::PAGE_BYTES;

pub(crate) const EPOCH_MAGIC: u32 = u32::from_le_bytes(*b"SPEP");
/// Magic of the checkpoint side file (for [`read_side_file`]).
pub const CHECKPOINT_MAGIC: u32 = u32::from_le_bytes(*b"SPCK");
const SIDE_FILE_VERSION: u32 = 1;
const SIDE_HEADER_BYTES: usize = 32;
/// Largest write issued at once while writing a side file.
const SIDE_WRITE_CHUNK_BYTES: usize = 1 << 20;
/// Largest side file read back (a checkpoint of a very large backlog).
pub const SIDE_FILE_BYTES_MAX: u64 = 4 << 30;

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
    let temp = dir.join(temp_name(name));
    // A temporary file left by a crash may be longer than this one; start clean.
    let _ = storage.remove(&temp).await;
    let file = storage.open(&temp).await?;
    let total = SIDE_HEADER_BYTES + payload.len();
    let padded = total.div_ceil(PAGE_BYTES as usize) * PAGE_BYTES as usize;
    let mut header = [0u8; SIDE_HEADER_BYTES];
    header[0..4].copy_from_slice(&magic.to_le_bytes());
    header[4..8].copy_from_slice(&SIDE_FILE_VERSION.to_le_bytes());
    header[8..16].copy_from_slice(&(payload.len() as u64).to_le_bytes());
    header[16..24].copy_from_slice(&value.to_le_bytes());
    header[24..28].copy_from_slice(&crc32c::crc32c(payload).to_le_bytes());
    let header_crc = crc32c::crc32c(&header[..28]);
    header[28..32].copy_from_slice(&header_crc.to_le_bytes());

    let mut written = 0usize;
    while written < padded {
        let chunk = (padded - written).min(SIDE_WRITE_CHUNK_BYTES);
        let mut buf = file.alloc_buf(chunk);
        {
            let out = buf.as_mut();
            out.fill(0);
            // Copy the part of header+payload that falls in [written, written+chunk).
            for (index, byte) in out.iter_mut().enumerate() {
                let at = written + index;
                if at < SIDE_HEADER_BYTES {
                    *byte = header[at];
                } else if at < total {
                    *byte = payload[at - SIDE_HEADER_BYTES];
                } else {
                    break;
                }
            }
        }
        if cfg!(feature = "failpoints") {
            failpoint(&format!("{name}.write"), IoOp::Write, &temp, Some(written as u64))?;
        }
        file.write_at(Rc::new(buf), written as u64).await?;
        written += chunk;
    }
    if cfg!(feature = "failpoints") {
        failpoint(&format!("{name}.sync"), IoOp::Sync, &temp, None)?;
    }
    file.fdatasync().await?;
    drop(file);
    if cfg!(feature = "failpoints") {
        failpoint(&format!("{name}.rename"), IoOp::Rename, &temp, None)?;
    }
    storage.rename(&temp, &dir.join(name)).await?;
    if cfg!(feature = "failpoints") {
        failpoint(&format!("{name}.dir_sync"), IoOp::SyncDir, dir, None)?;
    }
    storage.sync_dir(dir).await?;
    Ok(())
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
    let mut bytes = Vec::with_capacity(len as usize);
    let mut pos = 0u64;
    while pos < len {
        let want = ((len - pos) as usize).min(SIDE_WRITE_CHUNK_BYTES);
        let want = want.div_ceil(PAGE_BYTES as usize) * PAGE_BYTES as usize;
        let chunk = file.read_at(pos, want).await?;
        if chunk.is_empty() {
            break;
        }
        bytes.extend_from_slice(&chunk);
        pos += chunk.len() as u64;
    }
    bytes.truncate(len as usize);
    if bytes.len() < SIDE_HEADER_BYTES {
        return Err(invalid(format!("only {} bytes", bytes.len())));
    }
    let u32_at =
        |at: usize| u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]]);
    let u64_at = |at: usize| {
        let mut raw = [0u8; 8];
        raw.copy_from_slice(&bytes[at..at + 8]);
        u64::from_le_bytes(raw)
    };
    if u32_at(28) != crc32c::crc32c(&bytes[..28]) {
        return Err(invalid("header crc mismatch".to_owned()));
    }
    if u32_at(0) != magic {
        return Err(invalid(format!("bad magic {:#010x}", u32_at(0))));
    }
    if u32_at(4) != SIDE_FILE_VERSION {
        return Err(invalid(format!("unsupported version {}", u32_at(4))));
    }
    let payload_len = u64_at(8);
    let end = (SIDE_HEADER_BYTES as u64).saturating_add(payload_len);
    if end > bytes.len() as u64 {
        return Err(invalid(format!("payload of {payload_len} bytes runs past the file end")));
    }
    let payload = bytes[SIDE_HEADER_BYTES..end as usize].to_vec();
    if u32_at(24) != crc32c::crc32c(&payload) {
        return Err(invalid("payload crc mismatch".to_owned()));
    }
    Ok(Some(SideFile { value: u64_at(16), payload }))
}
