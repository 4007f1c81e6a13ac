//! Appending: `append` assigns offsets synchronously and copies the batch
//! into the commit being gathered (an O_DIRECT buffer that grows as batches
//! arrive), starting a new gather (and a new segment) when the open one
//! cannot hold it; `writable` waits for room under the pending bound.

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use spool_wire::batch::{BatchHeader, BatchKind};

use super::disk::failpoint;
use super::error::LogError;
use super::handle::Log;
use super::index::{IndexEntry, SparseIndex};
use super::layout::{commit_span, segment_path};
use super::preparer::wants_next;
use super::state::{close_open, Gather, Segment, State};
use super::{Appended, CommitCell, GatherSlot, Offset, Ticket};
use crate::io::{IoOp, Storage, StorageFile};
use crate::limits::{GATHER_BUF_INITIAL_BYTES, PAGE_BYTES, SEGMENTS_MAX};

impl<S: Storage> Log<S> {
    /// Assigns offsets to `batch`, stamps its header and queues it for the
    /// next commit. Returns at once; await the ticket for durability.
    ///
    /// # Errors
    /// [`LogError::InvalidBatch`] (framing or body crc),
    /// [`LogError::BatchLengthMismatch`], [`LogError::BatchTooLarge`],
    /// [`LogError::NotAppendable`] (fillers, empty batches),
    /// [`LogError::Backpressure`] when `pending_bytes_max` would be exceeded
    /// (nothing is queued; await [`Log::writable`] and retry),
    /// [`LogError::TooManySegments`], [`LogError::Failed`], [`LogError::Closed`].
    pub fn append(&self, batch: &[u8]) -> Result<Appended, LogError> {
        self.append_as(batch, true)
    }

    /// [`Log::append`] of a batch nobody is to wait for at once (the
    /// partition's claims, extends, releases and expiries, which reply
    /// without their own sync): with a commit delay set
    /// ([`Log::set_commit_delay`]) its commit may stay open for the delay,
    /// to ride the next commit someone waits for. Awaiting its ticket takes
    /// the commit at once.
    ///
    /// # Errors
    /// As [`Log::append`].
    pub fn append_deferred(&self, batch: &[u8]) -> Result<Appended, LogError> {
        self.append_as(batch, false)
    }

    fn append_as(&self, batch: &[u8], wanted: bool) -> Result<Appended, LogError> {
        failpoint("log.append", IoOp::Write, &self.shared.dir, None)?;
        let header = BatchHeader::verify_body(batch).map_err(LogError::InvalidBatch)?;
        if header.batch_len as usize != batch.len() {
            return Err(LogError::BatchLengthMismatch {
                declared: header.batch_len,
                given: batch.len(),
            });
        }
        let len = batch.len() as u64;
        let config = &self.shared.config;
        if len > config.batch_bytes_max {
            return Err(LogError::BatchTooLarge {
                len_bytes: len,
                max_bytes: config.batch_bytes_max,
            });
        }
        if header.kind == BatchKind::Filler {
            return Err(LogError::NotAppendable("filler batches are written by the log only"));
        }
        if header.record_count == 0 {
            return Err(LogError::NotAppendable("a batch must hold at least one record"));
        }
        let appended = {
            let mut state = self.shared.state.borrow_mut();
            if let Some(reason) = &state.failed {
                return Err(LogError::Failed(reason.to_string()));
            }
            if state.closing {
                return Err(LogError::Closed);
            }
            if state.disk_full && header.kind == BatchKind::Data {
                return Err(LogError::DiskFull);
            }
            let limit_bytes = config.pending_limit(header.kind);
            if state.pending_bytes + len > limit_bytes {
                return Err(LogError::Backpressure {
                    pending_bytes: state.pending_bytes,
                    limit_bytes,
                });
            }
            let fits =
                state.open.as_ref().is_some_and(|g| commit_span(g.data_bytes + len) <= g.cap_bytes);
            if !fits {
                self.start_gather(&mut state, len)?;
            }
            let base_offset = state.next_offset;
            let next_offset = base_offset + u64::from(header.record_count);
            let interval = config.index_interval_bytes;
            let last_index_pos = state.gather_last_index_pos;
            let epoch = self.shared.leader_epoch;
            let state_fields = &mut *state;
            let Some(gather) = state_fields.open.as_mut() else {
                unreachable!("start_gather leaves an open gather");
            };
            let at = gather.data_bytes as usize;
            grow_gather(gather, &state_fields.alloc_file, len);
            let slot = &mut gather.buf.as_mut()[at..at + batch.len()];
            slot.copy_from_slice(batch);
            BatchHeader::assign(slot, base_offset, epoch);
            let pos = gather.pos + gather.data_bytes;
            let indexed = last_index_pos.is_none_or(|last| pos >= last + interval);
            if indexed {
                gather.entries.push(IndexEntry { offset: base_offset, pos });
            }
            gather.data_bytes += len;
            gather.next_offset = next_offset;
            gather.batches += 1;
            if wanted {
                gather.commit.wanted.set(true);
            }
            let ticket = Ticket { commit: gather.commit.clone() };
            let slot = GatherSlot { seq: gather.seq, at: at as u64 };
            if indexed {
                state.gather_last_index_pos = Some(pos);
            }
            state.next_offset = next_offset;
            state.pending_bytes += len;
            let prepare = state.prepared.is_none() && wants_next(&state);
            let appended = Appended {
                base_offset: Offset(base_offset),
                next_offset: Offset(next_offset),
                ticket,
                slot,
            };
            (appended, prepare, fits)
        };
        let (appended, prepare, fits) = appended;
        if prepare {
            self.shared.prepare.notify_all();
        }
        // A deferred batch joining the open gather changes nothing a
        // committer waits on (it is held back, or already due).
        if wanted || !fits {
            self.shared.work.notify_all();
        }
        Ok(appended)
    }

    /// Replaces the batch appended at `slot` with `batch`, if no committer
    /// took its commit yet (the commit is still being gathered): `batch`
    /// must be of the same kind, length and record count, so it keeps the
    /// offsets, the place in the commit and the index entries of the one it
    /// replaces; it is stamped with the same base offset and leader epoch.
    /// Returns whether it was replaced; `false` (nothing changes) once the
    /// commit was handed to a write, or the log failed or is closing, or
    /// `batch` does not match. Its bytes are then written as if appended in
    /// the first place: the caller amends an event of its own whose commit
    /// has not been written (`partition/enqueue.rs`, attribution).
    pub fn replace_gathered(&self, slot: GatherSlot, batch: &[u8]) -> bool {
        let Ok(header) = BatchHeader::verify_body(batch) else { return false };
        let mut state = self.shared.state.borrow_mut();
        if state.failed.is_some() || state.closing {
            return false;
        }
        let epoch = self.shared.leader_epoch;
        let Some(gather) = state.open.as_mut().filter(|gather| gather.seq == slot.seq) else {
            return false;
        };
        let at = slot.at as usize;
        let end = at + batch.len();
        if end as u64 > gather.data_bytes || header.batch_len as usize != batch.len() {
            return false;
        }
        let target = &mut gather.buf.as_mut()[at..end];
        let Ok(old) = BatchHeader::parse(target) else { return false };
        let same = old.kind == header.kind
            && old.batch_len == header.batch_len
            && old.record_count == header.record_count;
        if !same {
            return false;
        }
        let base_offset = old.base_offset;
        target.copy_from_slice(batch);
        BatchHeader::assign(target, base_offset, epoch);
        true
    }

    /// Closes the open gather and starts a new one that can hold a batch of
    /// `len` bytes, moving to a new (not yet named) segment when the current
    /// one cannot hold the commit.
    fn start_gather(&self, state: &mut State<S::File>, len: u64) -> Result<(), LogError> {
        let config = &self.shared.config;
        let span = commit_span(len);
        let room = state.gather_segment.capacity.saturating_sub(state.gather_pos);
        if span > room {
            let count = state.segments.len() + usize::from(state.gather_segment_unopened);
            if count >= SEGMENTS_MAX {
                return Err(LogError::TooManySegments { count });
            }
            // The next segment could not be created: starting one would
            // leave commits (already applied by the caller) with nowhere
            // to go.
            if state.disk_full {
                return Err(LogError::DiskFull);
            }
        }
        if let Some(gather) = close_open(state) {
            state.queued.push_back(gather);
        }
        if state.gather_pos + span > state.gather_segment.capacity {
            let base = state.next_offset;
            // Segments start at `segment_bytes_initial` and double up to
            // `segment_bytes`; a log without a zero-filled segment (its
            // active segment is the empty file recovery created) gets its
            // first one here, under the same base offset.
            let capacity = config.next_segment_bytes(state.gather_segment.capacity, span);
            state.gather_segment = Rc::new(Segment {
                base,
                path: segment_path(&self.shared.dir, base),
                capacity,
                file: RefCell::new(None),
                index: RefCell::new(SparseIndex::default()),
                data_end: Cell::new(0),
                next_offset: Cell::new(base),
            });
            state.gather_pos = 0;
            state.gather_last_index_pos = None;
            state.gather_segment_unopened = true;
            state.rolls_pending.push_back(capacity);
            self.shared.prepare.notify_all();
        }
        let room = state.gather_segment.capacity - state.gather_pos;
        let cap_bytes = config.commit_bytes.max(span).min(room);
        assert!(cap_bytes >= span);
        assert!(state.gather_pos.is_multiple_of(PAGE_BYTES));
        // The buffer starts small and grows with the gather (`grow_gather`):
        // most commits are far below `commit_bytes`, and a buffer stays
        // allocated at its full size until the commit is durable (the tail
        // cache then keeps a copy of its span only).
        let buf_bytes = span.max(GATHER_BUF_INITIAL_BYTES).min(cap_bytes);
        let buf = state.alloc_file.alloc_buf(buf_bytes as usize);
        let seq = state.next_seq;
        state.next_seq += 1;
        let opens_segment = std::mem::take(&mut state.gather_segment_unopened);
        state.open = Some(Gather {
            seq,
            buf,
            data_bytes: 0,
            cap_bytes,
            pos: state.gather_pos,
            segment: state.gather_segment.clone(),
            opens_segment,
            first_offset: state.next_offset,
            next_offset: state.next_offset,
            batches: 0,
            entries: Vec::new(),
            commit: CommitCell::new(self.shared.work.clone()),
        });
        Ok(())
    }

    /// Whether a data batch of `data_len` bytes and a control batch of
    /// `control_len` bytes appended right after it (no await between) would
    /// both fit under their pending bounds now; also true once the log
    /// failed or closed (`append` then says why). Await
    /// [`Log::writable`] for each and ask again while false.
    pub fn room_for_pair(&self, data_len: u64, control_len: u64) -> bool {
        let state = self.shared.state.borrow();
        if state.failed.is_some() || state.closing {
            return true;
        }
        let config = &self.shared.config;
        state.pending_bytes + data_len <= config.pending_limit(BatchKind::Data)
            && state.pending_bytes + data_len + control_len
                <= config.pending_limit(BatchKind::Control)
    }

    /// Resolves when a `len`-byte batch of `kind` would fit under its pending
    /// bound ([`crate::log::LogConfig::pending_limit`]: data batches stop earlier than
    /// control batches), or the log failed or closed (`append` then reports
    /// why).
    pub async fn writable(&self, kind: BatchKind, len: u64) {
        let limit_bytes = self.shared.config.pending_limit(kind);
        loop {
            {
                let mut state = self.shared.state.borrow_mut();
                if state.failed.is_some() || state.closing {
                    return;
                }
                // A log without a zero-filled segment (nothing appended
                // yet) has its first one prepared before the first append:
                // a full disk then refuses that append (`disk_full`) rather
                // than failing a commit whose events were applied.
                let needs_first = state.gather_segment.capacity == 0
                    && state.prepared.is_none()
                    && state.rolls_pending.is_empty()
                    && !state.disk_full;
                if needs_first {
                    if !state.first_segment_wanted {
                        state.first_segment_wanted = true;
                        drop(state);
                        self.shared.prepare.notify_all();
                    }
                } else if state.pending_bytes + len <= limit_bytes {
                    return;
                }
            }
            self.shared.space.wait().await;
        }
    }
}

/// Makes `gather`'s buffer hold `len` more bytes plus the filler that may
/// close its last page: doubles it (at most to the commit's `cap_bytes`,
/// which the caller already checked the batch fits) and copies what is
/// gathered.
fn grow_gather<F: StorageFile>(gather: &mut Gather<F>, alloc_file: &F, len: u64) {
    let needed = commit_span(gather.data_bytes + len);
    assert!(needed <= gather.cap_bytes);
    let have = gather.buf.as_ref().len() as u64;
    if needed <= have {
        return;
    }
    let grown = (have * 2).max(needed).min(gather.cap_bytes);
    let mut bigger = alloc_file.alloc_buf(grown as usize);
    let filled = gather.data_bytes as usize;
    bigger.as_mut()[..filled].copy_from_slice(&gather.buf.as_ref()[..filled]);
    gather.buf = bigger;
}
