//! Queueing entries in their lane: the checks an appended entry passes
//! (reserved partition fields, one intact batch, its lane's size limit),
//! each lane's bound on queued bytes and the back-pressure waits on it,
//! markers, deferred entries, and amending an entry still queued.
//!
//! What it must not do: build a commit, assign a position or touch a
//! file — a queued entry is the committers' from then on (`build.rs`) —
//! nor wait for durability: its ticket does.

use std::rc::Rc;

use super::{EntryMeta, Journal, Pending};
use crate::io::Storage;
use crate::log::journal::entry::{
    check_payload, Marker, ENTRY_HEADER_BYTES, FILLER_PARTITION, MARKER_BITS,
};
use crate::log::journal::error::JournalError;
use crate::log::journal::route::RELOCATED_BIT;
use crate::log::journal::{EntryCell, JournalTicket, Lane, PartitionHandle};

impl<S: Storage> Journal<S> {
    /// Queues `payload` (one record batch, both crcs intact) for
    /// `partition` in `lane`. Returns at once; the ticket resolves when the
    /// entry is durable.
    ///
    /// # Errors
    /// [`JournalError::ReservedPartition`], [`JournalError::InvalidEntry`]
    /// (not one intact batch), [`JournalError::EntryTooLarge`] (a control
    /// entry over `control_commit_bytes`, a data entry over
    /// `entry_bytes_max`), [`JournalError::Backpressure`] when the lane's
    /// queued bytes would pass its bound (nothing is queued; await
    /// [`Journal::writable`] and retry), [`JournalError::Failed`],
    /// [`JournalError::Closed`].
    pub fn append(
        &self,
        lane: Lane,
        partition: PartitionHandle,
        payload: &[u8],
    ) -> Result<JournalTicket, JournalError> {
        self.append_owned(lane, partition, EntryMeta::default(), payload.into())
    }

    /// [`Journal::append`] of a payload the caller already holds in a
    /// buffer of its own (a partition stamps offsets into its copy): queued
    /// without another copy.
    ///
    /// # Errors
    /// As [`Journal::append`].
    pub fn append_owned(
        &self,
        lane: Lane,
        partition: PartitionHandle,
        meta: EntryMeta,
        payload: Box<[u8]>,
    ) -> Result<JournalTicket, JournalError> {
        if partition.0 & MARKER_BITS != 0 && partition != FILLER_PARTITION {
            return Err(JournalError::ReservedPartition(partition.0));
        }
        check_payload(&payload).map_err(JournalError::InvalidEntry)?;
        self.append_owned_as(lane, partition, meta, payload, true)
    }

    /// Appends the `marker` of `handle`'s log at `meta` (control lane, no
    /// payload): [`Marker::Truncate`] cancels the entries of the handle
    /// from `meta.entry_index` on that lie before it in the journal,
    /// [`Marker::Commit`] records the log committed up to that index.
    /// Durable as any entry: await the ticket.
    ///
    /// # Errors
    /// [`JournalError::ReservedPartition`] for a handle with the marker
    /// bits set, [`JournalError::NotAppendable`] for index 0, and those of
    /// [`Journal::append`] (back-pressure, failed, closed).
    pub fn append_marker(
        &self,
        handle: PartitionHandle,
        marker: Marker,
        meta: EntryMeta,
        wanted: bool,
    ) -> Result<JournalTicket, JournalError> {
        if handle.0 & (MARKER_BITS | RELOCATED_BIT) != 0 {
            return Err(JournalError::ReservedPartition(handle.0));
        }
        if meta.entry_index == 0 {
            return Err(JournalError::NotAppendable("a marker names an entry index"));
        }
        let field = PartitionHandle(handle.0 | marker.bit());
        self.append_owned_as(Lane::Control, field, meta, Box::default(), wanted)
    }

    /// [`Journal::append_owned`] of an entry nobody waits for at once (a
    /// partition's claims, extends, releases and expiries, which reply
    /// without their own sync): with a commit delay set
    /// ([`Journal::set_commit_delay`]) a cycle of such entries only may wait
    /// for the delay, to ride the next cycle someone waits for. Awaiting
    /// its ticket takes the cycle at once.
    ///
    /// # Errors
    /// As [`Journal::append`].
    pub fn append_owned_deferred(
        &self,
        lane: Lane,
        partition: PartitionHandle,
        meta: EntryMeta,
        payload: Box<[u8]>,
    ) -> Result<JournalTicket, JournalError> {
        if partition.0 & MARKER_BITS != 0 && partition != FILLER_PARTITION {
            return Err(JournalError::ReservedPartition(partition.0));
        }
        check_payload(&payload).map_err(JournalError::InvalidEntry)?;
        self.append_owned_as(lane, partition, meta, payload, false)
    }

    /// Queues an entry whose payload the caller checked (or a marker's
    /// empty one).
    fn append_owned_as(
        &self,
        lane: Lane,
        partition: PartitionHandle,
        meta: EntryMeta,
        payload: Box<[u8]>,
        wanted: bool,
    ) -> Result<JournalTicket, JournalError> {
        if partition == FILLER_PARTITION {
            return Err(JournalError::ReservedPartition(partition.0));
        }
        let len_bytes = (ENTRY_HEADER_BYTES + payload.len()) as u64;
        let config = &self.shared.config;
        let max_bytes = match lane {
            Lane::Control => config.control_commit_bytes,
            Lane::Data => config.entry_bytes_max,
        };
        if len_bytes > max_bytes {
            return Err(JournalError::EntryTooLarge { lane, len_bytes, max_bytes });
        }
        let cell = {
            let mut state = self.shared.state.borrow_mut();
            if let Some(reason) = &state.failed {
                return Err(JournalError::Failed(reason.to_string()));
            }
            if state.closing {
                return Err(JournalError::Closed);
            }
            if lane == Lane::Data && state.disk_full {
                return Err(JournalError::DiskFull { file_bytes: state.next_len });
            }
            let limit_bytes = self.shared.pending_limit(lane);
            let queue = state.lane_mut(lane);
            if queue.pending_bytes + len_bytes > limit_bytes {
                return Err(JournalError::Backpressure {
                    lane,
                    pending_bytes: queue.pending_bytes,
                    limit_bytes,
                });
            }
            queue.pending_bytes += len_bytes;
            let cell = EntryCell::new(self.shared.wants.clone(), wanted);
            queue.entries.push_back(Pending { partition, meta, payload, cell: cell.clone() });
            // A deferred entry changes nothing a committer waits on unless
            // it is the first queued (a held cycle starts its delay) or
            // fills the control lane to a cycle's worth (the cycle is due).
            let due = state.control.entries.len() + state.data.entries.len() == 1
                || state.control.pending_bytes >= config.control_commit_bytes;
            (cell, due)
        };
        let (cell, due) = cell;
        if wanted || due {
            self.shared.wants.work.notify_all();
        }
        Ok(JournalTicket { cell })
    }

    /// Lets `amend` rewrite, in place, the payload of the entry `ticket`
    /// names while it is still queued in `lane` (no commit took it: its
    /// bytes are written as amended, as if appended so). `amend` returns
    /// whether it changed the payload; its length cannot change. Returns
    /// `false` without calling `amend` once a commit took the entry, or the
    /// journal failed or is closing.
    pub fn amend_queued(
        &self,
        lane: Lane,
        ticket: &JournalTicket,
        amend: impl FnOnce(&mut [u8]) -> bool,
    ) -> bool {
        if ticket.cell.position.get().is_some() {
            return false;
        }
        let mut state = self.shared.state.borrow_mut();
        if state.failed.is_some() || state.closing {
            return false;
        }
        // The entry amended is most often the newest of its lane.
        let queue = state.lane_mut(lane);
        let Some(entry) =
            queue.entries.iter_mut().rev().find(|entry| Rc::ptr_eq(&entry.cell, &ticket.cell))
        else {
            return false;
        };
        amend(&mut entry.payload)
    }

    /// Resolves when an entry of `len_bytes` (header included) would fit
    /// under `lane`'s bound, or the journal failed or closed (`append` then
    /// says why).
    pub async fn writable(&self, lane: Lane, len_bytes: u64) {
        let limit_bytes = self.shared.pending_limit(lane);
        loop {
            {
                let mut state = self.shared.state.borrow_mut();
                if state.failed.is_some() || state.closing {
                    return;
                }
                if state.lane_mut(lane).pending_bytes + len_bytes <= limit_bytes {
                    return;
                }
            }
            self.shared.space.wait().await;
        }
    }

    /// Whether an entry of `len_bytes` (header included) fits under
    /// `lane`'s bound now; also true once the journal failed or closed
    /// (`append` then says why).
    pub fn has_room(&self, lane: Lane, len_bytes: u64) -> bool {
        let limit_bytes = self.shared.pending_limit(lane);
        let mut state = self.shared.state.borrow_mut();
        state.failed.is_some()
            || state.closing
            || state.lane_mut(lane).pending_bytes + len_bytes <= limit_bytes
    }
}
