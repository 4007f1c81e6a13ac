//! A partition: one log ([`PartitionLog`]) plus the queue state folded
//! from it.
//!
//! Owns the order of every state change: **decide → append → apply → sync →
//! reply**. The pure state machine (`queue/`) decides which events a request
//! produces; the log assigns their offsets synchronously at append; the state
//! applies them at once (so the next decision sees them); the reply waits for
//! the commit that holds them to be durable. Because the log's durable
//! watermark is contiguous, a reply that waited for its own events has also
//! waited for every event it depended on.
//!
//! Claims, extends and releases are the exception: **decide → append →
//! apply → reply**, without waiting for their commit. That is safe because
//! (1) a claim hands out only records below the log's durable watermark
//! (the decision takes it as an argument), so a reply never names a record
//! a crash could lose, and (2) the epoch fence at open: every claim still
//! outstanding after replay was made under an older epoch, whose tokens are
//! refused, and is ended at once (`PartitionState::fence`) with events made
//! durable before the partition serves. A claim (or extend, or release)
//! lost before its sync is therefore the same as one the fence ended. Acks,
//! enqueues, redrives and purges still reply only once durable.
//! `docs/design/queue-semantics.md` ("Claims before their sync") has the
//! argument.
//!
//! Recovery is the same fold: load the newest checkpoint (a snapshot of the
//! state at offset X), replay the log from X, then the epoch fence. The
//! leader epoch is kept in the shard journal's handles table and
//! incremented durably every time the partition is opened, before any
//! token can be issued, so tokens of an earlier open are stale.
//!
//! Does not own: sockets or frames (`net/`, `server/`), timers (the shard's
//! housekeeping tick calls [`Partition::tick`]), the clock (a [`Clock`] is
//! passed in), or glommio (the log's background future is handed to the
//! caller to spawn).
//!
//! Enqueue time: a record's `enqueue_time_ms` is stamped by the producer and
//! is inside the batch crc, so replay sees the same value the live path did.
//! The broker refuses records whose stamp is further than
//! [`ENQUEUE_CLOCK_SKEW_MS_MAX`] from its own clock, and records whose
//! `not_before_ms` or `expiry_ms` lies beyond `SCHEDULE_HORIZON_MS` (365
//! days) from it, or that would expire before they are due
//! (`INVALID_ARGUMENT`, nothing of the batch stored).
//!
//! Files, one job each: `open.rs` (recovery: checkpoint, replay, the epoch
//! fence), `enqueue.rs`, `claim.rs` (long-polls included), `delivery.rs`
//! (extend, ack, release), `operator.rs` (redrive, purge, dead letters),
//! `read.rs` (reading records back for a request, with its read-ahead
//! cache), `checkpoint.rs`, `housekeeping.rs` (tick, next deadline, close),
//! `error.rs`; beside them `signal.rs` (the register of waiting claims),
//! `files.rs` (side files), `dedupe_files.rs` (sealed dedupe generations
//! written once as side files, which checkpoints refer to), `epoch.rs`
//! (the leader epoch), `shard_replay.rs` (a shard journal's partitions
//! replayed in one pass in journal order at start) and `log.rs`
//! (`PartitionLog`: what the partition needs of its log, and the opaque
//! `LogCursor` a checkpoint records and replay starts from). This file
//! holds the partition itself and the append → apply step every request
//! path shares.

mod checkpoint;
mod claim;
mod dedupe_files;
mod delivery;
mod enqueue;
mod epoch;
mod error;
pub mod files;
mod housekeeping;
mod keys;
mod log;
mod membership;
pub mod memory;
mod open;
mod operator;
mod read;
mod relocate;
mod replicated;
mod scratch;
mod shard_replay;
pub mod signal;
pub mod snapshot;
mod subscriptions;

use std::cell::{Cell, RefCell};
use std::path::{Path, PathBuf};
use std::rc::Rc;

use crate::io::Storage;
use crate::log::{FatalHandler, Offset as LogOffset};
use crate::queue::{
    Event, LeaderEpoch, Millis, Offset, PartitionId, PartitionState, QueueCounters, QueueId,
    CLAIMED_EVENT_BYTES, EVENT_BYTES,
};
use signal::Signal;

pub use self::log::{
    Barrier, LastAppends, LogAppended, LogCursor, LogGrowth, LogMark, LogTicket, PartitionLog,
    QueuedSlot, Replay, ReplayBatch, CHECKPOINT_INDEX_BYTES, CHECKPOINT_INDEX_FLAG,
    JOURNAL_CHECKPOINT_PREFIX_BYTES,
};
pub use checkpoint::{checkpoint_interval_offsets, CheckpointStats};
pub use claim::ClaimedReady;
pub use enqueue::EnqueueOutcome;
pub use error::PartitionError;
pub use keys::KeyRoute;
pub use open::{JournalOpen, JournalReplayed, OpenReport};
pub use read::{Claimed, Peeked};
pub use relocate::{garbage_ratio, relocate_pass, RelocatePass, RelocateStep};
use replicated::Role;
pub use replicated::{Folded, ReplicaRoleStats, ReplicatedOpen};
pub use shard_replay::{replay_journal_shard, ShardReplayReport, ShardReplayTarget};
pub use subscriptions::StartAt;

pub use crate::limits::{
    CHECKPOINT_INTERVAL_BYTES, CHECKPOINT_INTERVAL_HELD_DIVISOR, CHECKPOINT_INTERVAL_OFFSETS,
    CHECKPOINT_STEP_BYTES_MAX, CHECKPOINT_STEP_ENTRIES, CONTROL_BATCH_EVENTS_MAX,
    DISK_FULL_RETRY_MS, ENQUEUE_CLOCK_SKEW_MS_MAX, READ_AHEAD_BYTES_MAX, REPLAY_READ_BYTES,
};
use crate::limits::{CONTROL_BATCH_OVERHEAD_BYTES, READ_AHEAD_RECORD_SLACK_BYTES};

/// Reads the broker clock. Injected so tests can drive time.
pub type Clock = Rc<dyn Fn() -> Millis>;

/// Names one partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionName {
    pub queue: String,
    pub queue_id: QueueId,
    pub partition: PartitionId,
}

/// One partition: its log, its state, its waiters.
pub struct Partition<S: Storage + Clone> {
    name: PartitionName,
    dir: PathBuf,
    storage: S,
    log: PartitionLog<S>,
    state: RefCell<PartitionState>,
    clock: Clock,
    /// The leader epoch tokens are issued under: bumped at every open on
    /// one node; a replicated partition's leader's term.
    epoch: Cell<LeaderEpoch>,
    /// A replicated partition's role (`replicated.rs`); `None` on one node.
    replica: Option<Role>,
    /// Waiting claims, woken when messages may have become claimable (see
    /// [`signal`]).
    claimable: Signal,
    /// Tickets of the newest appends (one per lane), so a checkpoint or a
    /// read can wait until everything appended is durable.
    appends: RefCell<LastAppends>,
    /// Where the newest checkpoint's state ends in the log.
    checkpoint_covers: Cell<LogCursor>,
    checkpoint_running: Cell<bool>,
    /// Told when a running checkpoint ends (so `close` can wait for it).
    checkpoint_ended: crate::log::wakers::Notify,
    last_checkpoint: Cell<Option<CheckpointStats>>,
    /// Told when a sync of this partition's files fails (production: exit).
    fatal: Rc<dyn FatalHandler>,
    /// A checkpoint's fdatasync or directory sync failed: no checkpoint is
    /// tried again (see [`Partition::checkpoint`]).
    sync_failed: Cell<bool>,
    closed: Cell<bool>,
    /// When the next disk-full retry may run ([`DISK_FULL_RETRY_MS`]).
    disk_retry_at_ms: Cell<Millis>,
    /// Told the state's next timer deadline after events are applied, so
    /// the shard's housekeeping can sleep until then (`shard/alarm.rs`).
    wakeup_hook: RefCell<Option<WakeupHook>>,
    /// Told whenever the partition's state or its waiting claims changed,
    /// so the shard's housekeeping visits it at its next tick
    /// (`Partition::set_touch_hook`).
    touch_hook: RefCell<Option<TouchHook>>,
    /// Told whenever main-lane messages may have become claimable, with
    /// how many (0: the tick found some ready), so the shard's ready ring
    /// lists the partition for claims of any partition
    /// (`Partition::set_ready_hook`).
    ready_hook: RefCell<Option<ReadyHook>>,
    /// Buffers the request paths reuse (`scratch.rs`).
    scratch: scratch::Scratch,
    /// The newest `Attributed` event while its commit is still open and it
    /// names the newest data batch: the next batch of the same principal
    /// extends it rather than append one of its own (`enqueue.rs`).
    attribution: RefCell<Option<enqueue::OpenAttribution>>,
    attribution_stats: Cell<AttributionStats>,
    /// This partition's charge on its shard's state share (`memory.rs`):
    /// set again whenever its state changed.
    memory: RefCell<memory::StateCharge>,
    /// Its place in its queue's key map (`keys.rs`).
    keys: keys::KeyState,
}

/// How the partition's batches were attributed since open
/// ([`Partition::attribution_stats`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AttributionStats {
    /// `Attributed` events appended.
    pub events: u64,
    /// Batches attributed by extending an event not yet written instead
    /// of appending one.
    pub extended: u64,
}

/// Receives a partition's next timer deadline (lease end, scheduled or
/// expiring message) whenever applied events may have brought it forward.
pub type WakeupHook = Rc<dyn Fn(Millis)>;

/// Told that a partition changed (events applied, a batch appended, a
/// claim started waiting): the shard's tick should look at it.
pub type TouchHook = Rc<dyn Fn()>;

/// Told that main-lane messages of a partition may have become claimable,
/// with how many (0: some are ready, count unknown; see
/// [`Partition::set_ready_hook`]).
pub type ReadyHook = Rc<dyn Fn(usize)>;

impl<S: Storage + Clone> std::fmt::Debug for Partition<S> {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("Partition")
            .field("name", &self.name)
            .field("dir", &self.dir)
            .field("epoch", &self.epoch.get())
            .finish_non_exhaustive()
    }
}

fn to_log(offset: Offset) -> LogOffset {
    LogOffset(offset.0)
}

impl<S: Storage + Clone> Partition<S> {
    /// The log's contiguous durable watermark as a queue offset: every
    /// record below it is on disk, so a claim may hand it out.
    fn durable_end(&self) -> Offset {
        Offset(self.log.durable_offset().0)
    }

    pub fn name(&self) -> &PartitionName {
        &self.name
    }

    /// Whether it was closed (its background work ends).
    pub fn is_closed(&self) -> bool {
        self.closed.get()
    }

    pub fn epoch(&self) -> LeaderEpoch {
        self.epoch.get()
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The log, for stats and tests.
    pub fn log(&self) -> &PartitionLog<S> {
        &self.log
    }

    /// How batches were attributed since open: events appended, batches
    /// that extended one instead.
    pub fn attribution_stats(&self) -> AttributionStats {
        self.attribution_stats.get()
    }

    /// Counters for DescribeQueue.
    pub fn counters(&self) -> QueueCounters {
        self.state.borrow().counters((self.clock)())
    }

    /// Runs `check` on the state for tests (read-only).
    /// Charges this partition's state to `meter` (its shard's state share)
    /// from now on, in place of where it was charged before.
    pub fn set_state_memory(&self, meter: Rc<memory::StateMemory>) {
        *self.memory.borrow_mut() = memory::StateCharge::new(meter);
        self.recharge();
    }

    /// Bytes this partition is charged against its shard's state share.
    pub fn memory_charged(&self) -> u64 {
        self.memory.borrow().bytes()
    }

    /// Sets the partition's charge to what its state may take now. Called
    /// after every change to the state (O(bands + dedupe generations)).
    fn recharge(&self) {
        let bytes = self.state.borrow().memory_charge();
        self.memory.borrow().set(bytes);
    }

    pub fn with_state<R>(&self, check: impl FnOnce(&PartitionState) -> R) -> R {
        check(&self.state.borrow())
    }

    /// Appends `events` as one control batch and applies them. Called inside
    /// a section with no await between the decision and this call, after
    /// the caller made room with [`PartitionLog::writable`].
    fn append_events(
        &self,
        events: &[Event],
        now: Millis,
    ) -> Result<Option<LogTicket>, PartitionError> {
        if events.is_empty() {
            return Ok(None);
        }
        Ok(Some(self.append_events_at(events, now, true)?.ticket))
    }

    /// [`append_events`](Self::append_events) of events whose reply does
    /// not wait for their durability (claims, extends, releases, the
    /// tick's expiries: a crash that loses them is covered by the epoch
    /// fence and the next tick). Their commit may wait for the next one
    /// someone waits for, within the log's commit delay
    /// ([`PartitionLog::append_deferred`]).
    fn append_events_deferred(&self, events: &[Event], now: Millis) -> Result<(), PartitionError> {
        if !events.is_empty() {
            self.append_events_at(events, now, false)?;
        }
        Ok(())
    }

    /// [`append_events`](Self::append_events) of at least one event,
    /// returning where the batch was appended; `wanted`: someone will wait
    /// for its durability ([`PartitionLog::append`]) or not
    /// ([`PartitionLog::append_deferred`]).
    fn append_events_at(
        &self,
        events: &[Event],
        now: Millis,
        wanted: bool,
    ) -> Result<LogAppended, PartitionError> {
        let appended = {
            let mut scratch = self.scratch.control.borrow_mut();
            let built = Self::build_control_batch(&mut scratch, events, now)
                .and_then(|()| self.log_append(&scratch.batch, wanted));
            scratch.recycle();
            built?
        };
        let mut state = self.state.borrow_mut();
        for event in events {
            if let Err(error) = state.apply(event) {
                // A decision and its apply were interleaved: a bug, and the
                // log now holds an event the state refused. Stop rather than
                // serve a state that diverges from its log.
                panic!("partition {:?}: event {event:?} does not apply: {error}", self.name);
            }
        }
        drop(state);
        self.recharge();
        self.appends.borrow_mut().note(spool_wire::batch::BatchKind::Control, &appended.ticket);
        self.hint_wakeup();
        Ok(appended)
    }

    /// Encodes `events` into `scratch.batch` as one control batch, with the
    /// scratch's builder and event buffer (no allocation once they have
    /// room).
    fn build_control_batch(
        scratch: &mut scratch::ControlScratch,
        events: &[Event],
        now: Millis,
    ) -> Result<(), PartitionError> {
        let scratch::ControlScratch { builder, encoded, batch } = scratch;
        builder.clear();
        for event in events {
            encoded.clear();
            event.encode(encoded).map_err(PartitionError::Token)?;
            builder.push(now, encoded)?;
        }
        builder.finish_into(batch)?;
        Ok(())
    }

    fn control_bytes(events: usize, claimed: bool) -> u64 {
        let per = if claimed { CLAIMED_EVENT_BYTES } else { EVENT_BYTES } as u64 + 8;
        CONTROL_BATCH_OVERHEAD_BYTES + per * events as u64
    }
}
