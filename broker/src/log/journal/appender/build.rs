//! Building commit cycles: when a committer may build (room in flight,
//! entries queued, no commit delay holding a cycle nobody waits for), what
//! a commit takes (control first, then data), the positions and the
//! durable watermark it stamps, its placement in the current or the next
//! file, and the witness entry an idle journal writes.
//!
//! What it must not do: write, sync or name a file, or move the durable
//! watermark — a built commit is a `Job` the committer carries out
//! (`committer.rs`).

use std::cell::RefCell;
use std::rc::Rc;

use super::{Inflight, Job, JournalFile, Pending, Shared, State};
use crate::io::{Storage, StorageFile};
use crate::limits::PAGE_BYTES;
use crate::log::journal::entry::{write_filler, EntryHeader, ENTRY_HEADER_BYTES};
use crate::log::journal::layout::commit_span;
use crate::log::journal::{JournalPos, Lane};

impl<S: Storage> Shared<S> {
    /// Waits until a commit can be built (room in flight, entries queued)
    /// and builds it, or builds a witness entry once the committers went
    /// idle; `None` when closed and drained (witness included), or failed.
    pub(super) async fn next_job(&self) -> Option<Job<S::File>> {
        loop {
            // A witness delay this committer is to wait out (only one does).
            let mut witness_delay = None;
            // The held commit (by its seq) whose commit delay this
            // committer is to wait out (only one does).
            let mut defer = None;
            {
                let mut state = self.state.borrow_mut();
                if state.failed.is_some() {
                    return None;
                }
                // In-flight bound: commits already synced but behind an
                // unsynced one still count, so no committer writes more than
                // `inflight_commits_max` commits past the durable watermark.
                let room = state.inflight.len() < self.config.inflight_commits_max;
                let queued = !state.control.entries.is_empty() || !state.data.entries.is_empty();
                let held = queued && room && self.held(&state);
                if held && !state.defer_armed {
                    state.defer_armed = true;
                    defer = Some(state.next_seq);
                }
                if room && queued && !held {
                    let job = self.build_commit(&mut state);
                    drop(state);
                    self.space.notify_all();
                    return Some(job);
                }
                // Idle: nothing queued in either lane, nothing in flight,
                // and the last durable entries vouched for by no header.
                if !queued
                    && state.inflight.is_empty()
                    && state.entries_end > state.recorded_watermark
                {
                    match self.witness_delay.borrow().clone() {
                        Some(delay) if !state.witness_ripe && !state.closing => {
                            if !state.witness_armed {
                                state.witness_armed = true;
                                witness_delay = Some(delay);
                            }
                        }
                        _ => {
                            state.witness_ripe = false;
                            return Some(self.build_witness(&mut state));
                        }
                    }
                }
                if witness_delay.is_none() && state.closing && room && !queued {
                    return None;
                }
            }
            match witness_delay {
                Some(delay) => {
                    let ran_out = crate::log::work_or_witness_delay(&self.wants.work, &delay).await;
                    let mut state = self.state.borrow_mut();
                    state.witness_armed = false;
                    state.witness_ripe |= ran_out;
                }
                None => self.work_wait(defer).await,
            }
        }
    }

    /// Whether the next cycle may be held back: nobody waits for any queued
    /// entry, a commit delay is set and has not run out for it, the control
    /// lane would not fill a cycle, and the journal is not closing.
    fn held(&self, state: &State<S::File>) -> bool {
        self.wants.queued.get() == 0
            && !state.closing
            && state.defer_ripe != Some(state.next_seq)
            && state.control.pending_bytes < self.config.control_commit_bytes
            && state.data.entries.is_empty()
            && self.commit_delay.is_set()
    }

    /// Waits for new work or, when `defer` names the held commit this
    /// committer waits out, for its commit delay to run out, whichever
    /// comes first ([`crate::log::HeldDelay::wait`]).
    async fn work_wait(&self, defer: Option<u64>) {
        let Some(seq) = defer else {
            self.wants.work.wait().await;
            return;
        };
        let ran_out = self.commit_delay.wait(&self.wants.work, seq).await;
        let mut state = self.state.borrow_mut();
        state.defer_armed = false;
        if ran_out {
            state.defer_ripe = Some(seq);
        } else if state.next_seq != seq {
            // Another committer built it meanwhile.
            self.commit_delay.taken(seq);
        }
    }

    /// Takes the cycle's entries — control first, then data — assigns their
    /// positions, stamps the durable watermark known now, closes the last
    /// page with a filler and puts the commit in flight.
    fn build_commit(&self, state: &mut State<S::File>) -> Job<S::File> {
        // This commit's headers vouch for every entry durable before it.
        state.witness_ripe = false;
        self.commit_delay.taken(state.next_seq);
        let config = &self.config;
        let mut taken: Vec<(Pending, Lane)> = Vec::new();
        let mut control_bytes = 0;
        while let Some(front) = state.control.entries.front() {
            let len = front.entry_bytes();
            if control_bytes + len > config.control_commit_bytes {
                break;
            }
            control_bytes += len;
            state.control.pending_bytes -= len;
            if let Some(entry) = state.control.entries.pop_front() {
                taken.push((entry, Lane::Control));
            }
        }
        let mut total = control_bytes;
        let mut data_taken = false;
        while let Some(front) = state.data.entries.front() {
            let len = front.entry_bytes();
            // The cycle's first data entry always goes, so a data entry
            // larger than what control left of `commit_bytes` still moves.
            if data_taken && total + len > config.commit_bytes {
                break;
            }
            total += len;
            data_taken = true;
            state.data.pending_bytes -= len;
            if let Some(entry) = state.data.entries.pop_front() {
                taken.push((entry, Lane::Data));
            }
        }
        assert!(!taken.is_empty(), "a commit is built only with entries queued");
        let span = commit_span(total);
        assert!(span <= config.commit_span_max());
        let opens_file = self.place(state, span);
        let seq = state.next_seq;
        state.next_seq += 1;
        let pos = state.build_pos;
        let watermark = JournalPos(state.durable_pos);
        assert!(watermark.0 <= pos);
        state.recorded_watermark = state.recorded_watermark.max(watermark.0);
        let mut buf = state.alloc_file.alloc_buf(span as usize);
        let buf_bytes = buf.as_mut().len();
        assert_eq!(buf_bytes as u64, span);
        let bytes = buf.as_mut();
        let mut at = 0usize;
        let mut cells = Vec::with_capacity(taken.len());
        let (mut control_entries, mut data_entries) = (0, 0);
        for (entry, lane) in taken {
            let len = entry.entry_bytes() as usize;
            let position = pos + at as u64;
            let header = EntryHeader::v2(
                entry.partition,
                JournalPos(position),
                watermark,
                u32::try_from(len).expect("entry length checked at append"),
                entry.meta.entry_index,
                entry.meta.term,
            );
            header.write_to(&mut bytes[at..at + ENTRY_HEADER_BYTES]);
            bytes[at + ENTRY_HEADER_BYTES..at + len].copy_from_slice(&entry.payload);
            entry.cell.taken();
            entry.cell.position.set(Some(position));
            entry.cell.commit_seq.set(Some(seq));
            cells.push(entry.cell);
            match lane {
                Lane::Control => control_entries += 1,
                Lane::Data => data_entries += 1,
            }
            at += len;
        }
        if span > total {
            write_filler(&mut bytes[at..], JournalPos(pos + total), watermark);
        }
        state.build_pos = pos + span;
        state.stats.commits_built += 1;
        if let Some(observer) = &*self.observer.borrow() {
            observer.built(seq);
        }
        let buf = Rc::new(buf);
        state.inflight.insert(
            seq,
            Inflight {
                synced: false,
                witness: false,
                pos,
                buf: buf.clone(),
                end_pos: pos + span,
                span,
                cells,
                control_entries,
                data_entries,
            },
        );
        Job { seq, witness: false, pos, buf, file: state.build_file.clone(), opens_file }
    }

    /// Moves the build position to the next file when `span` does not fit
    /// in the rest of the current one; true when it did (the commit opens
    /// that file).
    fn place(&self, state: &mut State<S::File>, span: u64) -> bool {
        if state.build_pos + span <= state.build_file.end() {
            return false;
        }
        let base = state.build_file.end();
        let len_bytes = if state.placed.is_empty() {
            state.prepared.as_ref().map_or(state.next_len, |(_, len)| *len)
        } else {
            // The next file is placed already: this is the one after it.
            self.config.file_bytes
        };
        state.placed.push_back(len_bytes);
        state.build_file = Rc::new(JournalFile { base, len_bytes, file: RefCell::new(None) });
        state.build_pos = base;
        self.prepare.notify_all();
        true
    }

    /// Builds a witness entry (`shard-journal.md` §11, "Witness entries"):
    /// one page holding one filler whose watermark is the durable
    /// watermark, which covers every entry written so far, at the build
    /// position. It is an ordinary commit without tickets: it consumes its
    /// page (the next commit starts after it, nothing is written twice),
    /// joins the in-flight sequence, and the durable watermark passes it
    /// only once it is synced — so no entry after it is answered before it
    /// is durable.
    fn build_witness(&self, state: &mut State<S::File>) -> Job<S::File> {
        assert!(state.inflight.is_empty(), "a witness is built only when idle");
        let span = PAGE_BYTES;
        let opens_file = self.place(state, span);
        let seq = state.next_seq;
        state.next_seq += 1;
        let pos = state.build_pos;
        let watermark = state.durable_pos;
        assert!(watermark <= pos);
        assert!(watermark >= state.entries_end, "idle: every entry is durable");
        state.recorded_watermark = state.recorded_watermark.max(watermark);
        let mut buf = state.alloc_file.alloc_buf(span as usize);
        write_filler(buf.as_mut(), JournalPos(pos), JournalPos(watermark));
        state.build_pos = pos + span;
        let buf = Rc::new(buf);
        state.inflight.insert(
            seq,
            Inflight {
                synced: false,
                witness: true,
                pos,
                buf: buf.clone(),
                end_pos: pos + span,
                span,
                cells: Vec::new(),
                control_entries: 0,
                data_entries: 0,
            },
        );
        Job { seq, witness: true, pos, buf, file: state.build_file.clone(), opens_file }
    }
}
