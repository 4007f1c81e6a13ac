//! Reading batches back: from the in-memory tail cache of recent commits
//! when it covers the offset, then from the read-back (the batches the last
//! file read returned or held whole), otherwise from the segment files
//! through the sparse index with O_DIRECT reads of at least
//! `READ_BACK_MIN_BYTES`. A batch read from a file is crc-checked
//! here, right after it was read; a batch served from the tail cache is the
//! commit buffer this log built and is not checked again. Either way the
//! batch is returned as a range of the buffer that holds it, not a copy.
//! Only durable batches are visible.

use std::rc::Rc;

use spool_wire::batch::{BatchHeader, BatchKind};
use spool_wire::limits::BATCH_HEADER_BYTES;

use super::error::{CorruptDetail, LogError};
use super::handle::Log;
use super::state::Segment;
use super::window::Window;
use super::{Offset, ReadBatch, SharedBytes};
use crate::io::Storage;
use crate::limits::{PAGE_BYTES, READ_BACK_MIN_BYTES, READ_BYTES_MAX, SCAN_CHUNK_BYTES};

impl<S: Storage> Log<S> {
    /// Reads durable batches starting with the one holding `from`, until
    /// `max_bytes` is reached (at least one batch is returned when any is
    /// durable at or after `from`). Empty when `from` is at the durable end.
    /// Fillers are skipped.
    ///
    /// # Errors
    /// [`LogError::OffsetOutOfRange`] below the log start (retention),
    /// [`LogError::ReadTooLarge`], [`LogError::Corrupt`] naming file and
    /// position when a batch fails its crc, [`LogError::Io`].
    pub async fn read(&self, from: Offset, max_bytes: u64) -> Result<Vec<ReadBatch>, LogError> {
        if max_bytes > READ_BYTES_MAX {
            return Err(LogError::ReadTooLarge { max_bytes, limit_bytes: READ_BYTES_MAX });
        }
        let from = from.0;
        let (durable_end, start) = {
            let state = self.shared.state.borrow();
            (state.durable_offset, state.segments.first().map_or(0, |s| s.base))
        };
        if from < start {
            return Err(LogError::OffsetOutOfRange { offset: from, start });
        }
        if from >= durable_end {
            return Ok(Vec::new());
        }
        if let Some(batches) = self.read_tail(from, max_bytes)? {
            crate::io::stats::record_read(true);
            return Ok(batches);
        }
        if let Some(batches) = self.read_back(from, max_bytes) {
            crate::io::stats::record_read(true);
            return Ok(batches);
        }
        crate::io::stats::record_read(false);
        let segments: Vec<Rc<Segment<S::File>>> = {
            let state = self.shared.state.borrow();
            let first = state.segments.partition_point(|s| s.base <= from).saturating_sub(1);
            state.segments[first..].to_vec()
        };
        let mut out = Vec::new();
        let mut kept = Vec::new();
        let mut read_bytes = 0;
        for segment in segments {
            read_bytes +=
                read_segment(&segment, from, max_bytes, durable_end, &mut out, &mut kept).await?;
            if !out.is_empty() {
                break;
            }
        }
        if !out.is_empty() {
            let mut state = self.shared.state.borrow_mut();
            state.read_back = out.iter().cloned().chain(kept).collect();
            state.read_back_bytes = read_bytes;
        }
        Ok(out)
    }

    /// Serves the read from the batches the last file read kept when they
    /// hold `from`; `None` otherwise. They were crc-checked when read.
    fn read_back(&self, from: u64, max_bytes: u64) -> Option<Vec<ReadBatch>> {
        let state = self.shared.state.borrow();
        let kept = &state.read_back;
        if from < kept.first()?.header.base_offset {
            return None;
        }
        let first = kept.partition_point(|batch| batch.header.next_offset() <= from);
        if first == kept.len() {
            return None;
        }
        let mut out = Vec::new();
        let mut total = 0u64;
        for batch in &kept[first..] {
            out.push(batch.clone());
            total += u64::from(batch.header.batch_len);
            if total >= max_bytes {
                break;
            }
        }
        Some(out)
    }

    /// Serves the read from cached commits when the cache reaches back to
    /// `from`; `None` otherwise.
    fn read_tail(&self, from: u64, max_bytes: u64) -> Result<Option<Vec<ReadBatch>>, LogError> {
        let state = self.shared.state.borrow();
        let Some(oldest) = state.tail.front() else { return Ok(None) };
        if from < oldest.first_offset {
            return Ok(None);
        }
        let first = state.tail.partition_point(|c| c.next_offset <= from);
        let mut out = Vec::new();
        let mut total = 0u64;
        for cached in state.tail.iter().skip(first) {
            let bytes = cached.buf.as_ref().as_ref();
            let shared = SharedBytes::from_shared(cached.buf.clone());
            let mut pos = 0usize;
            while pos + BATCH_HEADER_BYTES <= bytes.len() {
                let at = cached.pos + pos as u64;
                let corrupt = |error| LogError::Corrupt {
                    path: cached.path.clone(),
                    pos: at,
                    detail: CorruptDetail::Batch(error),
                };
                // The cached commit is the buffer this log built and wrote:
                // its data batches passed `verify_body` on append, its
                // control batches and fillers were built here. Parsing the
                // header is enough; the crcs were computed when it was made.
                let header = BatchHeader::parse(&bytes[pos..]).map_err(corrupt)?;
                let len = header.batch_len as usize;
                if pos + len > bytes.len() {
                    return Err(corrupt(spool_wire::WireError::Truncated {
                        needed: pos + len,
                        available: bytes.len(),
                    }));
                }
                if header.kind != BatchKind::Filler && header.next_offset() > from {
                    out.push(ReadBatch { header, bytes: shared.slice(pos..pos + len) });
                    total += len as u64;
                    if total >= max_bytes {
                        return Ok(Some(out));
                    }
                }
                pos += len;
            }
        }
        Ok(Some(out))
    }
}

/// Reads `segment`'s batches from the one holding `from` into `out` until
/// `max_bytes`, then the batches that the bytes already read hold whole into
/// `kept` (no further read: the read-back). Reads at least
/// [`READ_BACK_MIN_BYTES`]. Returns the bytes read from the file.
async fn read_segment<F: crate::io::StorageFile>(
    segment: &Segment<F>,
    from: u64,
    max_bytes: u64,
    durable_end: u64,
    out: &mut Vec<ReadBatch>,
    kept: &mut Vec<ReadBatch>,
) -> Result<u64, LogError> {
    let Some(file) = segment.file() else { return Ok(0) };
    let data_end = segment.data_end.get();
    let chunk = (max_bytes.max(READ_BACK_MIN_BYTES).div_ceil(PAGE_BYTES) * PAGE_BYTES + PAGE_BYTES)
        .min(SCAN_CHUNK_BYTES);
    let mut window = Window::new(&*file, chunk);
    let mut pos = segment.index.borrow().floor_pos(from);
    let mut total = 0u64;
    let mut filled = false;
    let header_bytes = BATCH_HEADER_BYTES as u64;
    while pos + header_bytes <= data_end {
        if filled && !window.holds(pos, header_bytes) {
            break;
        }
        let corrupt = |detail| LogError::Corrupt { path: segment.path.clone(), pos, detail };
        let head = window.get(pos, header_bytes).await?;
        if head.iter().all(|byte| *byte == 0) {
            break;
        }
        // Past what was asked, a batch that does not check is left out of
        // the read-back, not reported: the read that asks for it fails on it.
        let header = match BatchHeader::parse(head) {
            Ok(header) => header,
            Err(_) if filled => break,
            Err(error) => return Err(corrupt(CorruptDetail::Batch(error))),
        };
        let len = u64::from(header.batch_len);
        if filled && !window.holds(pos, len) {
            break;
        }
        let bytes = window.get(pos, len).await?;
        match BatchHeader::verify(bytes) {
            Ok(_) => {}
            Err(_) if filled => break,
            Err(error) => return Err(corrupt(CorruptDetail::Batch(error))),
        }
        if header.base_offset >= durable_end {
            break;
        }
        if header.kind != BatchKind::Filler && header.next_offset() > from {
            let batch = ReadBatch { header, bytes: window.share(pos, len) };
            if filled {
                kept.push(batch);
            } else {
                out.push(batch);
                total += len;
                filled = total >= max_bytes;
            }
        }
        pos += len;
    }
    Ok(window.read_bytes())
}
