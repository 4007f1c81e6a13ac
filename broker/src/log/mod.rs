//! The log: one journal per shard ([`journal`]), holding every partition's
//! data and control entries, with group commit, recovery and retention.
//! Each partition has its own dense offsets inside it
//! ([`journal::JournalPartition`]).
//!
//! What it owns: every byte under a shard's `journal/` directory, the
//! assignment of offsets, and the meaning of "durable" (a ticket resolves
//! only when its entry and every entry before it are fdatasynced). What it
//! does not do: decide what to append (the queue state machine does), read
//! a clock, or name a runtime — it is generic over [`crate::io::Storage`],
//! so the same code runs on O_DIRECT files and on the crash simulator.
//!
//! Files: `journal/` (the shard journal: appender, recovery, reads,
//! retention, the handles table), `config.rs` ([`LogConfig`], the broker's
//! log settings the journal derives its own from), `error.rs`
//! ([`LogError`]), `disk.rs` (failpoints), `shared.rs` ([`SharedBytes`]),
//! `wakers.rs` (the wake-up primitive); this file the fatal-error handlers and
//! the commit and witness delays the journal shares with its tests.
//!
//! Layout, commit protocol and crash cases: `docs/design/shard-journal.md`.

mod config;
mod disk;
mod error;
pub mod journal;
mod shared;
pub mod vote;
pub(crate) mod wakers;

use std::cell::RefCell;

pub use config::{ConfigError, LogConfig};
pub(crate) use disk::failpoint;
pub use error::LogError;
pub use shared::SharedBytes;

/// Makes the future a witness entry of the shard journal waits for before
/// it is built, once the committers went idle: a commit built meanwhile
/// vouches instead ([`journal::Journal::set_witness_delay`]). The log reads
/// no clock; the broker makes a timer of `WITNESS_DELAY_MS`. The commit
/// delay ([`journal::Journal::set_commit_delay`]) is made the same way.
pub type WitnessDelay = std::rc::Rc<dyn Fn() -> DelayFuture>;

/// One delay a [`WitnessDelay`] made.
pub type DelayFuture = std::pin::Pin<Box<dyn std::future::Future<Output = ()>>>;

/// The commit delay of a held journal cycle, by the seq that cycle has or
/// will get: made on the first wait and kept across the waiting committer's
/// wake-ups, so appends meanwhile do not restart it
/// ([`journal::Journal::set_commit_delay`]).
#[derive(Default)]
pub(crate) struct HeldDelay {
    delay: RefCell<Option<WitnessDelay>>,
    running: RefCell<Option<(u64, DelayFuture)>>,
}

impl HeldDelay {
    pub(crate) fn set(&self, delay: WitnessDelay) {
        *self.delay.borrow_mut() = Some(delay);
    }

    /// Whether a delay is set (without one nothing is held).
    pub(crate) fn is_set(&self) -> bool {
        self.delay.borrow().is_some()
    }

    /// Waits for `work` or for the delay of held commit `seq` to run out,
    /// whichever comes first; true when it ran out (or none is set). A
    /// delay that work interrupted goes on at the next wait for `seq`.
    pub(crate) async fn wait(&self, work: &Notify, seq: u64) -> bool {
        let timer = match self.running.borrow_mut().take() {
            Some((running_seq, timer)) if running_seq == seq => Some(timer),
            _ => self.delay.borrow().as_ref().map(|delay| delay()),
        };
        let Some(mut timer) = timer else { return true };
        let ran_out = futures_lite::future::or(
            async {
                work.wait().await;
                false
            },
            async {
                (&mut timer).await;
                true
            },
        )
        .await;
        if !ran_out {
            *self.running.borrow_mut() = Some((seq, timer));
        }
        ran_out
    }

    /// Commit `seq` was taken: its delay is done with.
    pub(crate) fn taken(&self, seq: u64) {
        let mut running = self.running.borrow_mut();
        if running.as_ref().is_some_and(|(running_seq, _)| *running_seq == seq) {
            *running = None;
        }
    }
}

/// Waits for new `work` or for a witness `delay` to run out, whichever
/// comes first; true when the delay ran out (the witness is then due
/// without another wait). Work arriving first ends the wait: its commit
/// vouches instead of the witness.
pub(crate) async fn work_or_witness_delay(work: &wakers::Notify, delay: &WitnessDelay) -> bool {
    let timer = delay();
    futures_lite::future::or(
        async {
            work.wait().await;
            false
        },
        async {
            timer.await;
            true
        },
    )
    .await
}
use spool_wire::batch::BatchHeader;
use wakers::Notify;

/// Position of a record in a partition log: the workspace's one `Offset`
/// (`spool_wire::proto::ids`), the same type the queue and the wire use.
pub use spool_wire::proto::Offset;

/// Why the log (or its partition) stopped. In production each becomes a
/// [`crate::fatal::FatalReason`], whose table owns the process exit codes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FatalCode {
    WriteFailed,
    SyncFailed,
    PrepareFailed,
    RollFailed,
    /// A partition side file (checkpoint, epoch) failed its fdatasync or
    /// directory sync; raised by the partition through the same handler.
    SideFileSyncFailed,
}

impl From<FatalCode> for crate::fatal::FatalReason {
    fn from(code: FatalCode) -> Self {
        use crate::fatal::FatalReason;
        match code {
            FatalCode::WriteFailed => FatalReason::LogWrite,
            FatalCode::SyncFailed => FatalReason::LogSync,
            FatalCode::PrepareFailed => FatalReason::LogPrepare,
            FatalCode::RollFailed => FatalReason::LogRoll,
            FatalCode::SideFileSyncFailed => FatalReason::SideFileSync,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FatalReason {
    pub code: FatalCode,
    pub message: String,
}

/// Called once when a write or sync fails. There is no in-process answer to
/// a failed fdatasync (the page cache state is unknown; retrying can report
/// success for lost data), so production exits.
pub trait FatalHandler {
    fn fatal(&self, reason: &FatalReason);
}

/// Production handler: exits through [`crate::fatal::fatal`] (logged, with
/// the reason's code), so no sibling shard keeps serving beside a log in an
/// unknown state.
#[derive(Clone, Copy, Debug, Default)]
pub struct ExitOnFatal;

impl FatalHandler for ExitOnFatal {
    fn fatal(&self, reason: &FatalReason) {
        crate::fatal::fatal(reason.code.into(), format_args!("log: {}", reason.message));
    }
}

/// Test handler: records every reason.
#[derive(Debug, Default)]
pub struct RecordFatal {
    reasons: RefCell<Vec<FatalReason>>,
}

impl RecordFatal {
    pub fn reasons(&self) -> Vec<FatalReason> {
        self.reasons.borrow().clone()
    }
}

impl FatalHandler for RecordFatal {
    fn fatal(&self, reason: &FatalReason) {
        self.reasons.borrow_mut().push(reason.clone());
    }
}

/// One batch read back: its header, and its bytes as a range of the buffer
/// the log holds them in (no copy). Both crcs were checked when the batch
/// was read from a journal file; a batch served from the commit cache is the
/// commit buffer the journal built from validated batches, and is not
/// checked again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadBatch {
    pub header: BatchHeader,
    pub bytes: SharedBytes,
}
