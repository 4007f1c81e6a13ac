//! A snapshot install's journal side (`docs/design/replication.md` §6,
//! "Install"): the [`Marker::Install`] naming the (index, term) a
//! replicated partition's log starts again after, then the snapshot's live
//! records as relocated copies stamped with that index and term, all
//! durable before the install's checkpoint is renamed into place. Until
//! that checkpoint names the marker's position, recovery takes the marker
//! and its copies out ([`super::route::settle_installs`]): a crash or a
//! failed transfer leaves the log that was there.
//!
//! What it must not do: write side files or open the partition (the
//! partition's install does, with the entries [`JournalInstall::finish`]
//! returns as the partition's recovered list).

use std::rc::Rc;

use spool_wire::batch::{BatchHeader, BatchKind};

use super::appender::EntryMeta;
use super::entry::{Marker, ENTRY_ALIGN, ENTRY_HEADER_BYTES};
use super::error::JournalError;
use super::route::{relocated_field, RoutedEntry};
use super::shard::ShardJournal;
use super::{JournalTicket, Lane, PartitionHandle};
use crate::io::Storage;

/// An install being written: see the module docs.
pub struct JournalInstall<S: Storage> {
    shard: Rc<ShardJournal<S>>,
    handle: PartitionHandle,
    meta: EntryMeta,
    marker: JournalTicket,
    /// Each copy's ticket and what its routed entry says of it.
    copies: Vec<(JournalTicket, RoutedEntry)>,
}

impl<S: Storage> ShardJournal<S> {
    /// Starts an install of partition `handle`'s log after (`index`,
    /// `term`): appends its marker.
    ///
    /// # Errors
    /// [`JournalError::NotAppendable`] for index 0, those of the journal's
    /// append (a handle the table does not hold is refused by the caller's
    /// open, later).
    pub fn begin_install(
        self: &Rc<Self>,
        handle: PartitionHandle,
        index: u64,
        term: u64,
    ) -> Result<JournalInstall<S>, JournalError> {
        let meta = EntryMeta { entry_index: index, term };
        let marker = self.journal.append_marker(handle, Marker::Install, meta, true)?;
        Ok(JournalInstall { shard: self.clone(), handle, meta, marker, copies: Vec::new() })
    }
}

impl<S: Storage> JournalInstall<S> {
    /// Appends `batch`, a data batch of the snapshot (offsets and epoch as
    /// its leader stamped them, crcs checked here), as a relocated copy;
    /// waits for room in the data lane first.
    ///
    /// # Errors
    /// [`JournalError::InvalidBatch`], [`JournalError::NotAppendable`] for
    /// a batch that is not data, and those of the journal's append.
    pub async fn copy(&mut self, batch: &[u8]) -> Result<(), JournalError> {
        let header = BatchHeader::verify(batch).map_err(JournalError::InvalidBatch)?;
        if header.kind != BatchKind::Data || batch.len() != header.batch_len as usize {
            return Err(JournalError::NotAppendable("a snapshot's record batch must be data"));
        }
        let journal = &self.shard.journal;
        journal.writable(Lane::Data, (ENTRY_HEADER_BYTES + batch.len()) as u64).await;
        let field = relocated_field(self.handle);
        let ticket = journal.append_owned(Lane::Data, field, self.meta, batch.into())?;
        let entry_len = (ENTRY_HEADER_BYTES + batch.len()).next_multiple_of(ENTRY_ALIGN);
        let routed = RoutedEntry {
            position: super::JournalPos(0),
            lane: Lane::Data,
            first_offset: header.base_offset,
            record_count: header.record_count,
            batch_len: header.batch_len,
            entry_len: u32::try_from(entry_len).unwrap_or(u32::MAX),
            relocated: true,
            entry_index: self.meta.entry_index,
            term: self.meta.term,
            install: false,
        };
        self.copies.push((ticket, routed));
        Ok(())
    }

    /// Waits until the marker and every copy are durable; returns the
    /// marker's position (the log start the install's checkpoint records)
    /// and the partition's entries as recovery would route them from
    /// there, for its open.
    ///
    /// # Errors
    /// The journal's failure.
    pub async fn finish(self) -> Result<(u64, Vec<RoutedEntry>), JournalError> {
        self.marker.durable().await?;
        let position = self.marker.position().ok_or_else(|| {
            JournalError::Failed("an install marker durable without a position".into())
        })?;
        let mut routed = vec![RoutedEntry {
            position,
            lane: Lane::Control,
            first_offset: 0,
            record_count: 0,
            batch_len: 0,
            entry_len: ENTRY_HEADER_BYTES as u32,
            relocated: false,
            entry_index: self.meta.entry_index,
            term: self.meta.term,
            install: true,
        }];
        for (ticket, mut entry) in self.copies {
            ticket.durable().await?;
            entry.position = ticket.position().ok_or_else(|| {
                JournalError::Failed("a snapshot copy durable without a position".into())
            })?;
            routed.push(entry);
        }
        Ok((position.0, routed))
    }
}
