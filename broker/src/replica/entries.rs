//! Stored batches as Raft entries: the batch a term's start (raft-rs's
//! empty entry) and a membership change (raft-rs's change entry) are
//! stored as, the entry a stored batch stands for, and the read-back of a
//! partition's entries by index (at open, and for a lagging follower,
//! `view.rs`).

use bytes::Bytes;
use raft::eraftpb::Entry;
use spool_wire::batch::{BatchHeader, BatchKind, BatchView, ControlBatchBuilder};

use super::error::DriverError;
#[cfg(doc)]
use super::limits::REPLICA_FETCH_AHEAD_BYTES;
use super::limits::REPLICA_FETCH_BYTES_MAX;
use super::membership::{change_entry, MembershipChange};
use crate::io::Storage;
use crate::log::journal::{JournalError, JournalPartition};
use crate::queue::Event;

/// The batch raft-rs's empty entry of `term` is stored as, landing at data
/// offset `next_offset`: one `TermStarted` control record, timestamp 0,
/// the same on every member.
///
/// # Errors
/// [`DriverError::TermTooLarge`].
pub fn term_start_batch(term: u64, next_offset: u64) -> Result<Vec<u8>, DriverError> {
    one_event_batch(Event::TermStarted { term }, term, next_offset)
}

/// The batch raft-rs's change entry of `change` in `term` is stored as,
/// landing at data offset `next_offset`: one `Membership` control record,
/// timestamp 0, the same on every member.
///
/// # Errors
/// [`DriverError::TermTooLarge`].
pub fn membership_batch(
    change: MembershipChange,
    term: u64,
    next_offset: u64,
) -> Result<Vec<u8>, DriverError> {
    one_event_batch(Event::Membership { change }, term, next_offset)
}

fn one_event_batch(event: Event, term: u64, next_offset: u64) -> Result<Vec<u8>, DriverError> {
    let epoch = u32::try_from(term).map_err(|_| DriverError::TermTooLarge { term })?;
    let mut record = Vec::new();
    let mut builder = ControlBatchBuilder::new();
    let built = event
        .encode(&mut record)
        .map_err(|error| DriverError::InvalidBatch(error.to_string()))
        .and_then(|_| {
            builder.push(0, &record).map_err(|error| DriverError::InvalidBatch(error.to_string()))
        })
        .and_then(|()| {
            builder.finish().map_err(|error| DriverError::InvalidBatch(error.to_string()))
        })?;
    let mut bytes = built.to_vec();
    BatchHeader::assign(&mut bytes, next_offset, epoch);
    Ok(bytes)
}

/// The event of a control batch of one record, if `batch` is one.
fn single_event(batch: &[u8]) -> Option<Event> {
    let header = BatchHeader::verify_body(batch).ok()?;
    if header.kind != BatchKind::Control || header.record_count != 1 {
        return None;
    }
    let view = BatchView::validate(batch).ok()?;
    Event::decode(view.control_record(0)).ok()
}

/// Whether `batch` is a term's start (a control batch of one `TermStarted`
/// record): it stands for raft-rs's empty entry.
pub fn is_term_start(batch: &[u8]) -> bool {
    matches!(single_event(batch), Some(Event::TermStarted { .. }))
}

/// The change `batch` stores, if it is a membership change (a control
/// batch of one `Membership` record): it stands for raft-rs's change entry.
pub fn membership_of_batch(batch: &[u8]) -> Option<MembershipChange> {
    match single_event(batch) {
        Some(Event::Membership { change }) => Some(change),
        _ => None,
    }
}

/// The Raft entry a stored batch stands for.
pub fn raft_entry(index: u64, term: u64, batch: &[u8]) -> Entry {
    match single_event(batch) {
        Some(Event::TermStarted { .. }) => Entry { index, term, ..Entry::default() },
        Some(Event::Membership { change }) => change_entry(index, term, change),
        _ => Entry { index, term, data: Bytes::copy_from_slice(batch), ..Entry::default() },
    }
}

/// The Raft entries of `part` from `low` toward `high` (exclusive), read
/// back by index in reads of at most [`REPLICA_FETCH_BYTES_MAX`]: all of
/// them when opening, [`REPLICA_FETCH_AHEAD_BYTES`] (`bytes_max`,
/// `entries_max`, at least one entry) for a lagging follower.
pub(super) async fn read_raft_entries<S: Storage>(
    part: &JournalPartition<S>,
    low: u64,
    high: u64,
    bytes_max: u64,
    entries_max: usize,
) -> Result<Vec<Entry>, DriverError> {
    // For a follower, a few messages' worth at a time (raft-rs sends at most
    // REPLICA_APPEND_BYTES_MAX per append, and asks again for the rest): a
    // follower far behind must not make the leader read its whole gap into
    // memory, nor wait one pump step per message.
    let mut entries = Vec::new();
    let mut bytes = 0u64;
    let mut next = low;
    while next < high && bytes < bytes_max && entries.len() < entries_max {
        let read =
            part.read_entries(next, high, REPLICA_FETCH_BYTES_MAX.min(bytes_max - bytes)).await?;
        if read.is_empty() {
            if !entries.is_empty() {
                break;
            }
            let durable_index = part.committed_index();
            return Err(JournalError::EntryNotDurable { index: next, durable_index }.into());
        }
        next += read.len() as u64;
        bytes += read.iter().map(|e| e.batch.bytes.len() as u64).sum::<u64>();
        entries.extend(read.iter().map(|e| raft_entry(e.index, e.term, &e.batch.bytes)));
    }
    entries.truncate(entries_max);
    Ok(entries)
}
