//! Committers, one per in-flight slot: take what has gathered, close its
//! last page with a filler, (roll to the prepared segment,) write its pages
//! with one `write_at`, fdatasync, and mark it synced. The durable watermark
//! advances only over a contiguous prefix of synced commits, and only then
//! are tickets resolved; durable commits enter the tail cache.

use std::rc::Rc;

use futures_lite::future::zip;
use spool_wire::batch::write_filler;

use super::disk::{failpoint, zero_fill};
use super::layout::{commit_span, PREPARED_FILE_NAME};
use super::state::{
    close_open, Cached, Gather, Inflight, Job, Segment, Shared, State, Task, WitnessJob,
};
use super::{CommitStatus, FatalCode};
use crate::io::{IoBuf, IoOp, Storage, StorageFile};
use crate::limits::PAGE_BYTES;

impl<S: Storage> Shared<S> {
    /// Waits for a gathered commit, or a witness page once the committers
    /// went idle (after the witness delay, when one is set); `None` when
    /// closed and drained, or failed.
    async fn next_job(&self) -> Option<Task<S::File>> {
        loop {
            // A witness delay this committer is to wait out (only one does).
            let mut witness_delay = None;
            // The open gather (by seq) whose commit delay this committer is
            // to wait out (only one does).
            let mut defer = None;
            {
                let mut state = self.state.borrow_mut();
                if state.failed.is_some() {
                    return None;
                }
                // In-flight bound: at most `inflight_commits_max` commits
                // between the durable watermark and the newest write. A
                // committer whose own commit synced while an earlier one
                // has not must not write further ahead: a crash would then
                // leave more unsynced bytes after the damage than
                // `recovery_window_bytes` (inflight × the largest commit)
                // allows, and recovery would refuse an ordinary torn tail
                // as corruption.
                let room = state.inflight.len() < self.config.inflight_commits_max;
                // The next commit reuses the witness page's position: it
                // starts only once that page is written and synced (two
                // writes to one page in flight may land in either order).
                let witness_inflight = state.witness_inflight;
                let gather = if !room || witness_inflight {
                    None
                } else if let Some(gather) = state.queued.pop_front() {
                    Some(gather)
                } else if let Some(seq) = self.deferred(&state) {
                    if !state.defer_armed {
                        state.defer_armed = true;
                        defer = Some(seq);
                    }
                    None
                } else {
                    close_open(&mut state)
                };
                if let Some(gather) = gather {
                    let job = self.start_commit(&mut state, gather);
                    drop(state);
                    self.space.notify_all();
                    return Some(Task::Commit(job));
                }
                if witness_inflight {
                    // Woken when the page is synced (or the log failed).
                } else if witness_due(&state) {
                    match self.witness_delay.borrow().clone() {
                        Some(delay) if !state.witness_ripe && !state.closing => {
                            if !state.witness_armed {
                                state.witness_armed = true;
                                witness_delay = Some(delay);
                            }
                        }
                        _ => {
                            state.witness_ripe = false;
                            if let Some(witness) = self.start_witness(&mut state) {
                                return Some(Task::Witness(witness));
                            }
                            if state.closing && room {
                                return None;
                            }
                        }
                    }
                } else if state.closing && room {
                    return None;
                }
            }
            match (witness_delay, defer) {
                (Some(delay), _) => {
                    let ran_out = crate::log::work_or_witness_delay(&self.work, &delay).await;
                    let mut state = self.state.borrow_mut();
                    state.witness_armed = false;
                    state.witness_ripe |= ran_out;
                }
                (None, Some(seq)) => self.wait_commit_delay(seq).await,
                (None, None) => self.work.wait().await,
            }
        }
    }

    /// The open gather's seq when its commit may be held back: nobody waits
    /// for it, a commit delay is set, its delay has not run out, and the
    /// log is not closing. A gather that filled up was queued, not open.
    fn deferred(&self, state: &State<S::File>) -> Option<u64> {
        let gather = state.open.as_ref()?;
        let held = !gather.commit.wanted.get()
            && !state.closing
            && state.defer_ripe != Some(gather.seq)
            && self.commit_delay.is_set();
        held.then_some(gather.seq)
    }

    /// Waits for new work or for the commit delay of gather `seq` to run
    /// out, whichever comes first ([`super::HeldDelay::wait`]).
    async fn wait_commit_delay(&self, seq: u64) {
        let ran_out = self.commit_delay.wait(&self.work, seq).await;
        let mut state = self.state.borrow_mut();
        state.defer_armed = false;
        if ran_out {
            state.defer_ripe = Some(seq);
        } else if state.open.as_ref().is_none_or(|gather| gather.seq != seq) {
            // Another committer took it meanwhile.
            self.commit_delay.taken(seq);
        }
    }

    /// Closes a gather's last page with a filler and moves it in flight.
    fn start_commit(&self, state: &mut State<S::File>, gather: Gather<S::File>) -> Job<S::File> {
        // A witness delay that ran out is for the idle log before this
        // commit; the next idle transition waits again.
        state.witness_ripe = false;
        self.commit_delay.taken(gather.seq);
        let Gather {
            seq,
            mut buf,
            data_bytes,
            cap_bytes,
            pos,
            segment,
            opens_segment,
            first_offset,
            next_offset,
            batches,
            entries,
            commit,
        } = gather;
        let span = commit_span(data_bytes);
        assert!(span <= cap_bytes);
        assert!(pos.is_multiple_of(PAGE_BYTES));
        assert!(pos + span <= segment.capacity);
        if span > data_bytes {
            let filler = &mut buf.as_mut()[data_bytes as usize..span as usize];
            // The durable watermark known now: recovery refuses damage below
            // the highest one an intact later commit recorded (§ "Damage or
            // torn tail" of segment-format.md).
            let watermark = state.durable_offset;
            state.witnessed_offset = state.witnessed_offset.max(watermark);
            let len = (span - data_bytes) as usize;
            write_filler(filler, len, next_offset, self.leader_epoch, watermark);
        }
        let alloc_bytes = buf.as_ref().len() as u64;
        buf.trim(span as usize);
        let buf = Rc::new(buf);
        state.pending_bytes -= data_bytes;
        state.inflight.insert(
            seq,
            Inflight {
                synced: false,
                commit,
                segment: segment.clone(),
                pos,
                end_pos: pos + span,
                first_offset,
                next_offset,
                entries,
                buf: buf.clone(),
                alloc_bytes,
                batches,
                started: crate::clock::instant_now(),
            },
        );
        Job { seq, pos, buf, segment, opens_segment }
    }

    /// A witness page, when the committers are idle (nothing gathered,
    /// queued or in flight) and the durable watermark is above every
    /// watermark a filler recorded: the last commits then have no later
    /// commit to vouch that they were durable, and recovery could not tell
    /// damage to them from a torn tail. The page lies where the next commit
    /// starts and does not advance the segment's data end: that commit
    /// reuses it (it holds no acknowledged byte). None when the active
    /// segment has no page left (the next commit rolls).
    fn start_witness(&self, state: &mut State<S::File>) -> Option<WitnessJob<S::File>> {
        if !witness_due(state) {
            return None;
        }
        let segment = &state.gather_segment;
        let pos = state.gather_pos;
        if pos + PAGE_BYTES > segment.capacity {
            return None;
        }
        let file = segment.file()?;
        assert!(pos >= segment.data_end.get());
        assert_eq!(state.next_offset, state.durable_offset, "idle: everything is durable");
        let watermark = state.durable_offset;
        let mut buf = state.alloc_file.alloc_buf(PAGE_BYTES as usize);
        write_filler(buf.as_mut(), PAGE_BYTES as usize, watermark, self.leader_epoch, watermark);
        state.witnessed_offset = watermark;
        state.witness_inflight = true;
        let (base, capacity) = (segment.base, segment.capacity);
        Some(WitnessJob { base, capacity, pos, buf: Rc::new(buf), file })
    }

    /// Writes and syncs a witness page, then lets commits start again.
    /// False when the log failed.
    async fn write_witness(&self, witness: WitnessJob<S::File>) -> bool {
        let WitnessJob { base, capacity, pos, buf, file } = witness;
        match self.reserve(base, capacity, pos + PAGE_BYTES).await {
            Err(()) => return false,
            Ok(Some(claim)) => {
                if self.extend_reservation(claim).await.is_err() {
                    return false;
                }
            }
            Ok(None) => {}
        }
        let written = async {
            failpoint("log.witness.write", IoOp::Write, file.path(), Some(pos))?;
            file.write_at(buf, pos).await?;
            failpoint("log.witness.write.after", IoOp::Write, file.path(), Some(pos))
        };
        if let Err(error) = written.await {
            self.fail(FatalCode::WriteFailed, &error);
            return false;
        }
        if self.is_failed() {
            return false;
        }
        let synced = async {
            failpoint("log.witness.sync", IoOp::Sync, file.path(), None)?;
            file.fdatasync().await?;
            failpoint("log.witness.sync.after", IoOp::Sync, file.path(), None)
        };
        if let Err(error) = synced.await {
            self.fail(FatalCode::SyncFailed, &error);
            return false;
        }
        {
            let mut state = self.state.borrow_mut();
            state.witness_inflight = false;
            state.stats.witness_pages += 1;
        }
        self.work.notify_all();
        true
    }

    /// Marks `seq` synced and advances the durable watermark over the
    /// contiguous synced prefix, resolving those commits' tickets.
    fn mark_synced(&self, seq: u64) {
        let mut resolved = Vec::new();
        {
            let mut state = self.state.borrow_mut();
            if state.failed.is_some() {
                return;
            }
            match state.inflight.get_mut(&seq) {
                Some(commit) => commit.synced = true,
                None => unreachable!("synced commit {seq} is not in flight"),
            }
            while let Some(entry) = state.inflight.first_entry() {
                if !entry.get().synced {
                    break;
                }
                let (seq, done) = entry.remove_entry();
                assert_eq!(seq, state.durable_seq + 1, "durable watermark must be contiguous");
                state.durable_seq = seq;
                let segment = &done.segment;
                assert!(done.pos >= segment.data_end.get());
                segment.data_end.set(done.end_pos);
                segment.next_offset.set(done.next_offset);
                {
                    let mut index = segment.index.borrow_mut();
                    for entry in &done.entries {
                        index.push(*entry);
                    }
                }
                state.durable_offset = done.next_offset;
                state.stats.commits += 1;
                state.stats.batches += done.batches;
                state.stats.records += done.next_offset - done.first_offset;
                state.stats.commit_bytes += done.end_pos - done.pos;
                crate::io::stats::record_commit(
                    done.end_pos - done.pos,
                    crate::clock::instant_now().duration_since(done.started),
                );
                let cached_bytes = done.end_pos - done.pos;
                // The cache is bounded by the memory it holds, not by the
                // bytes committed: a gather buffer is allocated ahead of its
                // data (at least `GATHER_BUF_INITIAL_BYTES`, then doubling),
                // so a 4 KiB commit may sit in a 64 KiB buffer. Such a buffer
                // is copied into one of its span before it is cached, so the
                // bound holds as many commits as it has bytes for.
                // A commit larger than the whole cache would evict itself.
                if cached_bytes <= self.config.tail_cache_bytes {
                    let buf = if done.alloc_bytes > cached_bytes {
                        compact(&*state.alloc_file, &done.buf)
                    } else {
                        done.buf
                    };
                    state.tail.push_back(Cached {
                        first_offset: done.first_offset,
                        next_offset: done.next_offset,
                        path: segment.path.clone(),
                        pos: done.pos,
                        buf,
                    });
                    state.tail_bytes += cached_bytes;
                }
                while state.tail_bytes > self.config.tail_cache_bytes {
                    let Some(evicted) = state.tail.pop_front() else { break };
                    state.tail_bytes -= evicted.buf.as_ref().as_ref().len() as u64;
                }
                resolved.push(done.commit);
            }
        }
        let advanced = !resolved.is_empty();
        for commit in resolved {
            commit.resolve(CommitStatus::Durable);
        }
        self.durable.notify_all();
        if advanced {
            // Commits left the in-flight map: a committer held back by the
            // in-flight bound (`next_job`) may take the next one.
            self.work.notify_all();
        }
    }

    /// Gives the prepared file this segment's name, once every earlier commit
    /// (all of the old segment) is durable. False when the log failed.
    async fn roll(&self, segment: &Rc<Segment<S::File>>, seq: u64) -> bool {
        loop {
            {
                let state = self.state.borrow();
                if state.failed.is_some() {
                    return false;
                }
                if state.durable_seq + 1 == seq {
                    break;
                }
            }
            self.durable.wait().await;
        }
        let file = loop {
            {
                let mut state = self.state.borrow_mut();
                if state.failed.is_some() {
                    return false;
                }
                if let Some(prepared) = state.prepared.take() {
                    state.roll_waiting = false;
                    state.renaming = true;
                    assert!(state.rolls_pending.pop_front().is_some());
                    break prepared;
                }
                state.roll_waiting = true;
            }
            self.prepare.notify_all();
            self.prepared.wait().await;
        };
        let (file, prepared_bytes) = file;
        let prepared_path = self.dir.join(PREPARED_FILE_NAME);
        let renamed = async {
            // Prepared before a commit larger than its planned size started
            // this segment: zero the rest and sync it before the name.
            if prepared_bytes < segment.capacity {
                zero_fill(&*file, prepared_bytes, segment.capacity).await?;
                failpoint("log.prepare.sync", IoOp::Sync, file.path(), None)?;
                file.fdatasync().await?;
            }
            failpoint("log.roll.rename", IoOp::Rename, &prepared_path, None)?;
            self.storage.rename(&prepared_path, &segment.path).await?;
            failpoint("log.roll.dir_sync", IoOp::SyncDir, &self.dir, None)?;
            self.storage.sync_dir(&self.dir).await?;
            failpoint("log.roll.dir_sync.after", IoOp::SyncDir, &self.dir, None)
        };
        if let Err(error) = renamed.await {
            self.fail(FatalCode::RollFailed, &error);
            return false;
        }
        {
            let mut state = self.state.borrow_mut();
            state.renaming = false;
            *segment.file.borrow_mut() = Some(file.clone());
            let replaces_empty =
                state.segments.last().is_some_and(|last| last.base == segment.base);
            if replaces_empty {
                // The rename replaced the empty file of a log that held no
                // batch (a base offset starts one segment only otherwise:
                // every commit holds at least one record).
                let last = state.segments.len() - 1;
                state.segments[last] = segment.clone();
            } else {
                if let Some(sealed) = state.segments.last().cloned() {
                    state.seal_queue.push_back(sealed);
                }
                state.segments.push(segment.clone());
            }
            state.alloc_file = file;
            state.stats.segments_rolled += 1;
        }
        self.named.notify_all();
        self.prepare.notify_all();
        true
    }

    async fn wait_named(&self, segment: &Segment<S::File>) -> Option<Rc<S::File>> {
        loop {
            if self.is_failed() {
                return None;
            }
            if let Some(file) = segment.file() {
                return Some(file);
            }
            self.named.wait().await;
        }
    }
}

/// One committer: take a commit, (roll,) write it, sync it, mark it synced.
pub(super) async fn committer<S: Storage>(shared: Rc<Shared<S>>) {
    loop {
        let job = match shared.next_job().await {
            None => break,
            Some(Task::Commit(job)) => job,
            Some(Task::Witness(witness)) => {
                if !shared.write_witness(witness).await {
                    break;
                }
                continue;
            }
        };
        if job.opens_segment && !shared.roll(&job.segment, job.seq).await {
            break;
        }
        let Some(file) = shared.wait_named(&job.segment).await else { break };
        // Nothing at or past a bound the reservation file may claim is
        // written; an extension ahead of need runs beside the commit.
        let end = job.pos + job.buf.as_ref().as_ref().len() as u64;
        let Ok(ahead) = shared.reserve(job.segment.base, job.segment.capacity, end).await else {
            break;
        };
        let io = async {
            let written = async {
                failpoint("log.commit.write", IoOp::Write, file.path(), Some(job.pos))?;
                file.write_at(job.buf.clone(), job.pos).await?;
                failpoint("log.commit.write.after", IoOp::Write, file.path(), Some(job.pos))
            };
            written.await.map_err(|error| (FatalCode::WriteFailed, error))?;
            if shared.is_failed() {
                return Ok(false);
            }
            let synced = async {
                failpoint("log.commit.sync", IoOp::Sync, file.path(), None)?;
                file.fdatasync().await?;
                failpoint("log.commit.sync.after", IoOp::Sync, file.path(), None)
            };
            synced.await.map_err(|error| (FatalCode::SyncFailed, error))?;
            Ok::<bool, (FatalCode, crate::io::IoError)>(true)
        };
        let (io, extended) = match ahead {
            Some(claim) => zip(io, shared.extend_reservation(claim)).await,
            None => (io.await, Ok(())),
        };
        match io {
            Err((code, error)) => {
                shared.fail(code, &error);
                break;
            }
            Ok(false) => break,
            Ok(true) => {}
        }
        if extended.is_err() {
            break;
        }
        shared.mark_synced(job.seq);
    }
    shared.state.borrow_mut().workers_running -= 1;
    shared.prepare.notify_all();
}

/// The committers are idle (nothing gathered, queued or in flight) and the
/// durable watermark is above every watermark a filler recorded: a witness
/// page is due ([`Shared::start_witness`]).
fn witness_due<F: StorageFile>(state: &State<F>) -> bool {
    let idle = state.open.is_none() && state.queued.is_empty() && state.inflight.is_empty();
    idle && state.durable_offset > state.witnessed_offset
}

/// A copy of `buf` in a buffer of exactly its length, so what the tail cache
/// keeps is what it counts.
fn compact<F: StorageFile>(alloc_file: &F, buf: &Rc<F::Buf>) -> Rc<F::Buf> {
    let bytes = buf.as_ref().as_ref();
    let mut exact = alloc_file.alloc_buf(bytes.len());
    exact.as_mut().copy_from_slice(bytes);
    Rc::new(exact)
}
