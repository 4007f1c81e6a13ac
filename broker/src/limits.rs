//! Named limits of the broker, in one place: the storage path, the network
//! edge, the config's ranges and defaults, the control plane, the shards and
//! the admin port.
//!
//! Every buffer, queue, file size, timeout and poll interval the broker uses
//! is a constant here; runtime knobs (`LogConfig`, `BrokerConfig`) are
//! validated against them. The `const _` assertions state the relations the
//! code relies on, so changing one number cannot silently break another.
//! Exceptions, each for its own reason: the queue state machine's bounds
//! (`queue/limits.rs`, with the pure core they bound), the HTTP API's
//! (`admin/api/limits.rs`, checked against the protocol's), and the on-disk
//! and wire layouts (sizes of a format, not tunable bounds), which live with
//! their codec. `tests/tests/tidy.rs` holds the rest of the tree to this.

use std::time::Duration;

use spool_wire::limits::{BATCH_BYTES_MAX, BATCH_HEADER_BYTES};
use spool_wire::proto::limits::{FRAME_HEADER_BYTES, MAX_FRAME_BYTES, PARTITIONS_MAX};

/// Smallest unit a disk may write atomically. We do **not** assume even this
/// is atomic (see `docs/design/shard-journal.md` §15); it is the granularity the
/// simulator tears writes at.
pub const SECTOR_BYTES: u64 = 512;

/// O_DIRECT alignment and the unit of a commit: every commit starts on a fresh
/// page and writes whole pages.
pub const PAGE_BYTES: u64 = 4096;

/// Smallest segment a log may be configured with (small segments keep tests
/// fast; production uses the default).
pub const SEGMENT_BYTES_MIN: u64 = 64 * 1024;
/// Largest segment: bounds the sparse index and per-segment scans.
pub const SEGMENT_BYTES_MAX: u64 = 1 << 30;
/// Default segment size (the size segments grow to): small enough that a
/// partition that fills one holds little, large enough that rolls are rare.
/// The one default of the setting; `control::config` uses it too.
pub const SEGMENT_BYTES_DEFAULT: u64 = 64 << 20;

/// Largest `commit_bytes` a log may be configured with. A single batch larger
/// than `commit_bytes` is committed alone, so the largest commit is the larger
/// of this and a maximal batch plus its filler page.
pub const COMMIT_BYTES_MAX: u64 = 8 << 20;
/// Default target size of one group commit.
pub const COMMIT_BYTES_DEFAULT: u64 = 1 << 20;

/// Most commits that may be written but not yet synced at once.
pub const INFLIGHT_COMMITS_MAX: usize = 8;
/// Default number of overlapping commits (write N+1 while N syncs: docs/design/shard-journal.md).
pub const INFLIGHT_COMMITS_DEFAULT: usize = 2;

/// Largest configurable bound on gathered-but-unwritten bytes per log.
pub const PENDING_BYTES_MAX: u64 = 256 << 20;
/// Default bound on gathered-but-unwritten bytes per log.
pub const PENDING_BYTES_DEFAULT: u64 = 32 << 20;
/// Default bound on gathered-but-unwritten bytes a **data** append may find
/// ahead of it. Control events (claims, acks, releases) may fill the log up
/// to the full pending bound, so a claim queues behind at most this much
/// producer data instead of `PENDING_BYTES_DEFAULT`: every data-path reply
/// waits for the contiguous durable watermark (docs/design/shard-journal.md), and 32 MiB of
/// queued enqueues at ~100–200 MB/s is 150–300 ms before a claim is acked.
/// One maximal batch's commit span (≈ 4 MiB, four default commits) is the
/// least it can be (a maximal batch must fit) and keeps the two in-flight
/// commits fed.
pub const DATA_PENDING_BYTES_DEFAULT: u64 = COMMIT_SPAN_FOR_MAX_BATCH;

/// Largest and default in-memory cache of recently committed pages, per
/// partition, counted at the memory its buffers hold.
pub const TAIL_CACHE_BYTES_MAX: u64 = 256 << 20;
pub const TAIL_CACHE_BYTES_DEFAULT: u64 = 8 << 20;

/// Size of one zero-fill write when preparing a segment, and of one read when
/// scanning a segment at recovery.
pub const ZERO_FILL_CHUNK_BYTES: u64 = 1 << 20;
pub const SCAN_CHUNK_BYTES: u64 = 1 << 20;
/// Chunk reads a journal recovery scan keeps in flight at once (its window
/// holds this many chunks plus one entry).
pub const SCAN_READS_IN_FLIGHT: u64 = 4;

/// Bytes of one read of a journal file for entries the commit cache no
/// longer holds: a lagging consumer's partition finds its entries spread
/// between every other partition's, so each read takes a whole chunk
/// (aligned to a multiple of it) and keeps it for the partitions that come
/// next (`read_ahead_bytes`).
pub const JOURNAL_READ_CHUNK_BYTES: u64 = 256 << 10;
const _: () = assert!(JOURNAL_READ_CHUNK_BYTES.is_multiple_of(PAGE_BYTES));

/// Largest `max_bytes` a single read may ask for.
pub const READ_BYTES_MAX: u64 = 64 << 20;

/// Partitions one claim of any partition visits in journal order: the
/// ring's first ones, each asked where its next messages lie
/// (`server/ready.rs`); the rest wait for the next claim. Bounds the work of
/// one claim over a ring of thousands of partitions.
pub const CLAIM_ANY_VISIT_PARTITIONS_MAX: usize = 64;
/// Messages of one partition whose journal positions a claim of any
/// partition looks at before deciding how many to take from it.
pub const CLAIM_ANY_PEEK_MESSAGES_MAX: u32 = 64;

/// Entries a replicated partition's log may hold above its committed index
/// (`docs/design/shard-journal.md` §14): each costs ≈ 56 bytes of memory
/// until it commits, and every journal file from the oldest of them on is
/// kept. Past it, appends are refused (`JournalError::UncommittedFull`,
/// throttled on the wire) until the log commits.
pub const LOG_UNCOMMITTED_ENTRIES_MAX: usize = 65_536;

/// Partitions a shard opens at once when a queue is created (each open
/// writes and syncs its epoch file and syncs its directory; run together,
/// those syncs overlap).
pub const PARTITION_OPENS_CONCURRENT: usize = 64;

/// How long start-up keeps retrying a shard port that is still in use. The
/// listening sockets of a SIGKILLed predecessor outlive it by a few
/// milliseconds (3–12 ms measured), and a supervisor restarts at once; a
/// port a live process holds still fails the start (`PortInUse`), after
/// this long.
pub const PORT_IN_USE_RETRY_MS: u64 = 2_000;
/// Pause between two attempts to bind a port still in use.
pub const PORT_IN_USE_RETRY_PAUSE_MS: u64 = 10;
/// Queues a start refused for memory names per shard, the largest first.
pub const MEMORY_REFUSAL_QUEUES_NAMED_MAX: usize = 5;

/// What a served partition is charged against its shard's state share
/// besides its queue state (`partition/memory.rs`): its structs, scratch
/// buffers, timers and journal index. Measured ≈ 5 KiB empty and ≈ 13 KiB
/// once it has served requests (bench/README.md, "Per-partition cost").
pub const PARTITION_MEMORY_BYTES_FIXED: u64 = 16 << 10;

/// Pause before a partition that failed to open for lack of disk space is
/// opened again (the shard's housekeeping retries it until it opens).
pub const PARTITION_OPEN_RETRY_MS: u64 = 1_000;

/// Journal layout: least time between two passes of a shard's journal
/// release (the least position its partitions still need, then every
/// journal file wholly below it removed; idle partitions that pin an old
/// file asked for a checkpoint). A pass costs O(partitions of the shard).
pub const JOURNAL_RELEASE_INTERVAL_MS: u64 = 1_000;
/// Journal layout: checkpoints a release pass runs at once (it may ask one
/// of every partition of the shard; the rest wait their turn, and no pass
/// asks more until they are done).
pub const JOURNAL_RELEASE_CHECKPOINTS_IN_FLIGHT: usize = 16;

/// Journal layout: default of `journal_garbage_ratio_max`, the share of
/// the held journal files (the newest aside) that may carry no live record
/// before the shard relocates the live entries of its oldest file to the
/// head so the file can be released (`docs/design/shard-journal.md` §6):
/// at 0.5 the journal holds at most about twice its live data (plus the
/// file being written and the relocation under way).
pub const JOURNAL_GARBAGE_RATIO_MAX_DEFAULT: f64 = 0.5;

/// Journal layout: default of `journal_retain_bytes`, the journal bytes a
/// shard may hold before it asks the partitions pinning its oldest files
/// for checkpoints (and relocates live entries). A file can only go once
/// every partition with an entry in it has checkpointed past it: with
/// thousands of partitions each holding a little of every file, releasing
/// each file as soon as possible costs a checkpoint (a side file and its
/// sync) per partition per file; holding up to this many bytes costs that
/// once per this many bytes written. 8 files of the default 64 MiB; a
/// restart replays at most about this much journal per shard.
pub const JOURNAL_RETAIN_BYTES_DEFAULT: u64 = 512 << 20;

/// How long a log stays idle after a commit before it writes the witness
/// that vouches for that commit: the shard journal's witness entry
/// (`docs/design/shard-journal.md` §11). A
/// commit built within it vouches instead, so a thin steady stream (a
/// commit every millisecond or so, as with many partitions each written a
/// little, or requests one at a time) does not pay a second write and sync
/// per commit; a commit damaged on the medium within this window of a crash
/// is cut instead of refused.
pub const WITNESS_DELAY_MS: u64 = 5;

/// How long a commit that nobody waits for (claims, extends, releases,
/// expiries: they reply without their own sync) may stay open for a commit
/// someone waits for (an enqueue, an ack) to carry it: a shard journal's
/// cycle (`Journal::set_commit_delay`, `docs/design/shard-journal.md` §3).
/// Bounds how long such events stay unwritten; a crash within it loses
/// them, which the epoch fence covers.
pub const COMMIT_DELAY_MS: u64 = 5;

/// Upper bound of `journal_retain_bytes` (1 TiB).
pub const JOURNAL_RETAIN_BYTES_MAX: u64 = 1 << 40;

/// Journal layout: most entry bytes one relocation pass of a shard copies
/// (passes run at most every [`JOURNAL_RELEASE_INTERVAL_MS`]), so
/// relocation takes a bounded share of the disk and never holds the
/// executor for long: at the default interval, 8 MiB/s per shard.
pub const JOURNAL_RELOCATE_BYTES_PER_PASS: u64 = 8 << 20;

/// Journal layout: most index entries one relocation pass looks at per
/// partition (each costs a state lookup per record it holds); the pass
/// yields to the executor every [`JOURNAL_RELOCATE_YIELD_ENTRIES`].
pub const JOURNAL_RELOCATE_ENTRIES_PER_PASS: usize = 65_536;

/// Journal layout: index entries a relocation pass looks at between two
/// yields to the executor.
pub const JOURNAL_RELOCATE_YIELD_ENTRIES: usize = 256;

/// Smallest filler batch: a bare header.
pub const FILLER_BYTES_MIN: u64 = BATCH_HEADER_BYTES as u64;

/// Bytes a commit holding one maximal batch occupies (batch, filler, page
/// rounding). Every segment must be able to hold one.
pub const COMMIT_SPAN_FOR_MAX_BATCH: u64 =
    (BATCH_BYTES_MAX as u64 + FILLER_BYTES_MIN).div_ceil(PAGE_BYTES) * PAGE_BYTES;

const _: () = assert!(PAGE_BYTES.is_multiple_of(SECTOR_BYTES));
const _: () = assert!(SEGMENT_BYTES_MIN.is_multiple_of(PAGE_BYTES));
const _: () = assert!(SEGMENT_BYTES_MAX.is_multiple_of(PAGE_BYTES));
const _: () = assert!(SEGMENT_BYTES_DEFAULT.is_multiple_of(PAGE_BYTES));
const _: () = assert!(SEGMENT_BYTES_MIN <= SEGMENT_BYTES_DEFAULT);
const _: () = assert!(SEGMENT_BYTES_DEFAULT <= SEGMENT_BYTES_MAX);
const _: () = assert!(COMMIT_BYTES_MAX.is_multiple_of(PAGE_BYTES));
const _: () = assert!(COMMIT_BYTES_DEFAULT.is_multiple_of(PAGE_BYTES));
const _: () = assert!(COMMIT_BYTES_DEFAULT <= COMMIT_BYTES_MAX);
const _: () = assert!(COMMIT_SPAN_FOR_MAX_BATCH <= COMMIT_BYTES_MAX);
const _: () = assert!(COMMIT_BYTES_MAX <= SEGMENT_BYTES_DEFAULT);
const _: () = assert!(INFLIGHT_COMMITS_DEFAULT >= 1);
const _: () = assert!(PORT_IN_USE_RETRY_PAUSE_MS > 0);
const _: () = assert!(PORT_IN_USE_RETRY_PAUSE_MS * 10 <= PORT_IN_USE_RETRY_MS);
// A waiting start must not come near the broker's start-up budget.
const _: () = assert!(PORT_IN_USE_RETRY_MS * 10 <= STARTUP_TIMEOUT_MS_DEFAULT);
const _: () = assert!(PARTITION_OPEN_RETRY_MS > 0);
const _: () = assert!(JOURNAL_RELEASE_INTERVAL_MS > 0);
const _: () = assert!(JOURNAL_RELOCATE_BYTES_PER_PASS > 0);
const _: () = assert!(JOURNAL_RELOCATE_YIELD_ENTRIES > 0);
const _: () = assert!(JOURNAL_RELOCATE_ENTRIES_PER_PASS >= JOURNAL_RELOCATE_YIELD_ENTRIES);
const _: () = assert!(INFLIGHT_COMMITS_DEFAULT <= INFLIGHT_COMMITS_MAX);
const _: () = assert!(PENDING_BYTES_DEFAULT <= PENDING_BYTES_MAX);
const _: () = assert!(DATA_PENDING_BYTES_DEFAULT <= PENDING_BYTES_DEFAULT);
const _: () = assert!(DATA_PENDING_BYTES_DEFAULT >= COMMIT_SPAN_FOR_MAX_BATCH);
const _: () = assert!(PENDING_BYTES_DEFAULT >= COMMIT_SPAN_FOR_MAX_BATCH);
const _: () = assert!(TAIL_CACHE_BYTES_DEFAULT <= TAIL_CACHE_BYTES_MAX);
const _: () = assert!(ZERO_FILL_CHUNK_BYTES.is_multiple_of(PAGE_BYTES));
const _: () = assert!(SCAN_CHUNK_BYTES.is_multiple_of(PAGE_BYTES));

/// Longest a shard's housekeeping timer sleeps when nothing falls due: it
/// bounds how late the process-wide stop flag, a due checkpoint and a
/// cross-executor wake-up glommio lost (ARCHITECTURE.md, "Platform notes") are seen. Deadlines of
/// leases, scheduled and expiring messages are met by the shard's alarm
/// (`shard/alarm.rs`), not by this bound.
pub const HOUSEKEEPING_IDLE_MAX: Duration = Duration::from_millis(100);

/// How often the housekeeping tick visits every partition of its shard
/// (`server/tick.rs`). Between sweeps it visits only the partitions touched
/// since the last tick or with a deadline passed, so an idle partition
/// costs one visit per sweep; the sweep is the safety net for a change no
/// hook reports (a disk that filled under an append retries within it).
pub const HOUSEKEEPING_FULL_SWEEP_MS: u64 = 1_000;
/// How often the coordinator polls for commands once none came for
/// [`COORDINATOR_BUSY_FOR`] (while they keep coming it polls every housekeeping
/// tick): the first create or delete after a quiet spell waits at most this.
pub const COORDINATOR_IDLE_POLL: Duration = Duration::from_millis(50);
/// How long after a command the coordinator keeps polling every tick.
pub const COORDINATOR_BUSY_FOR: Duration = Duration::from_secs(1);

const _: () = assert!(HOUSEKEEPING_IDLE_MAX.as_millis() >= HOUSEKEEPING_TICK_MS_MAX as u128);
const _: () = assert!(COORDINATOR_IDLE_POLL.as_millis() <= HOUSEKEEPING_IDLE_MAX.as_millis());

// --- Network edge (`net/`) -------------------------------------------------

/// Most bytes requested from the socket per read.
pub const READ_CHUNK_BYTES: usize = 64 * 1024;
/// How often a connection waiting for memory to grow its read buffer (and
/// so reading nothing) asks its socket whether the peer is gone
/// (`net/peer_watch.rs`): a dead peer's grant returns within this, not at
/// its frame deadline. One non-blocking `poll` per waiting connection each
/// time.
pub const MEMORY_WAIT_PEER_POLL: Duration = Duration::from_millis(200);
/// Responses already waiting are written together up to this many bytes
/// (the last one may pass it)...
pub const WRITE_BURST_BYTES_MAX: usize = 1 << 20;
/// ...or this many responses, whichever comes first.
pub const WRITE_BURST_RESPONSES_MAX: usize = 256;
/// Responses up to this size are copied into one buffer and written with
/// one syscall; a larger one is written from its own buffer (a copy would
/// cost more than the syscall it saves).
pub const WRITE_COPY_BYTES_MAX: usize = 16 * 1024;
/// Bytes of responses one connection may hold produced but not yet written
/// to its socket before the broker stops reading that connection's requests
/// until the peer has read enough (backpressure, not an error). Requests
/// already being handled still answer, so a connection holds at most this
/// plus the answers of its requests in flight. Four maximal write bursts.
pub const RESPONSE_QUEUE_BYTES_MAX: usize = 4 * WRITE_BURST_BYTES_MAX;
/// Frames one connection hands to tasks in one pass before its reading loop
/// yields to the rest of the shard, when no other connection waits for a
/// turn (while one does, the shard's admission turns of
/// [`ADMISSION_QUANTUM_FRAMES`] apply)...
pub const DISPATCH_BUDGET_FRAMES: usize = 32;
/// ...or bytes of frames, whichever comes first.
pub const DISPATCH_BUDGET_BYTES: usize = 256 * 1024;

/// Most frames one connection hands over in one turn while others wait
/// (`net/admission.rs`).
pub const ADMISSION_QUANTUM_FRAMES: usize = 4;
/// Bytes credited to a connection's deficit per turn.
pub const ADMISSION_QUANTUM_BYTES: i64 = 64 * 1024;
/// Most frames admitted in one round (between two I/O polls of the
/// executor when the shard is saturated)...
pub const ADMISSION_ROUND_FRAMES: usize = 64;
/// ...or bytes of frames, whichever comes first (a single larger frame is
/// still admitted whole).
pub const ADMISSION_ROUND_BYTES: usize = 2 * 1024 * 1024;

/// Pause after a failed `accept` (EMFILE and friends) so the loop does not
/// spin while the condition lasts.
pub const ACCEPT_ERROR_BACKOFF: Duration = Duration::from_millis(10);
/// Refused connections being told why at once; past this, a refused
/// connection is closed without its error frame (still counted and logged).
pub const REFUSALS_IN_FLIGHT_MAX: usize = 64;
/// A refused connection gets this long to take its error frame and close.
pub const REFUSAL_LINGER: Duration = Duration::from_millis(500);
/// A TLS connection must complete its handshake within this of being
/// accepted (shard ports and admin port), so a peer that connects and sends
/// nothing, or a plain client that waits for an answer, cannot hold a slot.
pub const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// What one TLS connection's buffers may hold, taken from the shard's
/// `requests` pool for the connection's life (`net/tls.rs`): rustls keeps
/// up to 64 KiB of TLS records to send, 16 KiB of received plaintext and
/// one incoming record (16 KiB and its overhead), plus its session.
pub const TLS_CONNECTION_MEMORY_BYTES: usize = 128 << 10;
/// Bytes a refused connection may send that are read and dropped while it
/// takes its error frame (so closing does not reset it first).
pub const REFUSAL_DRAIN_BYTES_MAX: usize = 64 * 1024;
/// Backlog of a shard's listening socket (glommio's own default).
pub const LISTEN_BACKLOG: libc::c_int = 1024;
/// At most one log line per rejection reason per this many milliseconds.
pub const REJECTION_LOG_INTERVAL_MS: u64 = 1_000;

/// Consumer pace (`net/pace.rs`, `docs/design/consumer-pace.md`): how long
/// a full claim keeps consumers counted as hungry, and saturated intake as
/// saturated; the shard paces enqueues only while both hold.
pub const PACE_WINDOW: Duration = Duration::from_millis(100);
/// Longest one enqueue frame is held while paced: producers slow down to
/// the consumers' pace, they never stop (a connection's floor is one frame
/// per hold).
pub const PACE_HOLD_MAX: Duration = Duration::from_millis(50);
/// Bytes of enqueue frames being handled at once from which the shard's
/// intake counts as saturated: far above what a moderate rate keeps in
/// flight (25k msgs/s of 1 KiB with a 2 ms sync ≈ 50 KiB), far below a
/// closed-loop producer's window of large batches (32 × 256 KiB).
pub const PACE_INTAKE_BYTES_MIN: usize = 1 << 20;
/// Most enqueue credit (messages) claims may bank while paced: how far
/// producers may run ahead of the consumers' pace in one go.
pub const PACE_CREDIT_MESSAGES_MAX: i64 = 4_096;
/// Range and default of `consumer_pace_percent`: while paced, enqueued
/// messages ≤ this % of delivered ones (0 turns the pace off). 110: claim +
/// ack ≥ 0.9 × enqueue under saturation.
pub const CONSUMER_PACE_PERCENT_MIN: u32 = 100;
pub const CONSUMER_PACE_PERCENT_MAX: u32 = 1_000;
pub const CONSUMER_PACE_PERCENT_DEFAULT: u32 = 110;

const _: () = assert!(WRITE_COPY_BYTES_MAX <= WRITE_BURST_BYTES_MAX);
const _: () = assert!(WRITE_BURST_RESPONSES_MAX >= 1);
const _: () = assert!(RESPONSE_QUEUE_BYTES_MAX >= WRITE_BURST_BYTES_MAX);
const _: () = assert!(ADMISSION_QUANTUM_FRAMES > 0);
const _: () = assert!(ADMISSION_QUANTUM_BYTES > 0);
const _: () = assert!(ADMISSION_ROUND_FRAMES >= ADMISSION_QUANTUM_FRAMES);
const _: () = assert!(ADMISSION_ROUND_BYTES >= ADMISSION_QUANTUM_BYTES as usize);
// A lone connection's pass never takes more than one admission round.
const _: () = assert!(DISPATCH_BUDGET_FRAMES <= ADMISSION_ROUND_FRAMES);
const _: () = assert!(DISPATCH_BUDGET_BYTES <= ADMISSION_ROUND_BYTES);
const _: () = assert!(REFUSALS_IN_FLIGHT_MAX >= 1);
const _: () = assert!(PACE_HOLD_MAX.as_millis() <= PACE_WINDOW.as_millis());
const _: () = assert!(PACE_CREDIT_MESSAGES_MAX > 0);
const _: () = assert!(CONSUMER_PACE_PERCENT_MIN <= CONSUMER_PACE_PERCENT_DEFAULT);
const _: () = assert!(CONSUMER_PACE_PERCENT_DEFAULT <= CONSUMER_PACE_PERCENT_MAX);

// --- Broker config (`control/config.rs`): ranges and defaults ---------------

/// Most shards one process runs (also bounded by the CPUs it may use).
pub const SHARDS_MAX: u16 = 256;
/// Longest `spin_before_park`: beyond a few ms spinning only burns a core.
pub const SPIN_BEFORE_PARK_US_MAX: u64 = 10_000;
/// Range and default of `io_poll_interval_us`: how long a busy shard's
/// connections run before they let the executor poll for completed I/O
/// (`net/poll_gate.rs`). Without it a shard saturated by pipelined requests
/// saw its finished log writes and syncs only at glommio's 100 ms preempt
/// timer (bench/README.md, "`hostile`").
pub const IO_POLL_INTERVAL_US_MIN: u64 = 100;
pub const IO_POLL_INTERVAL_US_MAX: u64 = 100_000;
pub const IO_POLL_INTERVAL_US_DEFAULT: u64 = 500;
const _: () = assert!(IO_POLL_INTERVAL_US_MIN <= IO_POLL_INTERVAL_US_DEFAULT);
const _: () = assert!(IO_POLL_INTERVAL_US_DEFAULT <= IO_POLL_INTERVAL_US_MAX);
/// The poll gate's interval while the shard has a disk write or sync in
/// flight (when shorter than `io_poll_interval_us`): its completion, and
/// the commit and replies it releases, wait at most this long behind busy
/// connections, so a producer's enqueue follows the disk rather than the
/// gate's clock (bench/README.md, "`hostile`").
pub const IO_POLL_INTERVAL_DISK_BUSY_US: u64 = 100;
const _: () = assert!(IO_POLL_INTERVAL_DISK_BUSY_US >= IO_POLL_INTERVAL_US_MIN);
/// Housekeeping tick range (ms). The tick also guards against glommio's lost
/// wake-up (ARCHITECTURE.md, "Platform notes"), which needs 1–10 ms to be effective.
pub const HOUSEKEEPING_TICK_MS_MIN: u64 = 1;
pub const HOUSEKEEPING_TICK_MS_MAX: u64 = 10;
pub const HOUSEKEEPING_TICK_MS_DEFAULT: u64 = 5;
/// Default bound on start-up, partition recovery included (a 7.2 M-message
/// partition measured ≈1 min to reopen on a loaded 2-vCPU VM), and its range.
pub const STARTUP_TIMEOUT_MS_DEFAULT: u64 = 120_000;
pub const STARTUP_TIMEOUT_MS_MIN: u64 = 100;
pub const STARTUP_TIMEOUT_MS_MAX: u64 = 300_000;
/// Default `partitions_max`: the node limit.
pub const PARTITIONS_MAX_DEFAULT: u32 = PARTITIONS_PER_NODE_MAX as u32;
/// Default and upper bound of `connections_per_shard_max`.
pub const CONNECTIONS_PER_SHARD_DEFAULT: u32 = 1_024;
pub const CONNECTIONS_PER_SHARD_LIMIT: u32 = 65_536;
/// Default and upper bound of `in_flight_per_connection_max`.
pub const IN_FLIGHT_PER_CONNECTION_DEFAULT: u32 = 128;
pub const IN_FLIGHT_PER_CONNECTION_LIMIT: u32 = 4_096;
/// Default `claim_waiters_per_connection_max`: half the default in-flight
/// bound, so a connection whose claims all wait still has room for acks.
pub const CLAIM_WAITERS_PER_CONNECTION_DEFAULT: u32 = 64;
/// Upper bound for `claim_waiters_per_connection_max`: a partition's own
/// bound on waiting claims.
pub const CLAIM_WAITERS_PER_CONNECTION_LIMIT: u32 = CLAIM_WAITERS_MAX as u32;
/// Smallest allowed `frame_bytes_max`: a frame header plus a useful body.
pub const FRAME_BYTES_MAX_LOWER: u32 = 4 * 1024;
/// Largest allowed `frame_bytes_max`: every connection may buffer one frame.
pub const FRAME_BYTES_MAX_UPPER: u32 = 64 * 1024 * 1024;
/// Default `frame_bytes_max`: the largest record batch plus room for the
/// frame header and request fields.
pub const FRAME_BYTES_MAX_DEFAULT: u32 = BATCH_BYTES_MAX as u32 + 64 * 1024;
/// `idle_timeout_ms`: a connection that sends nothing this long is closed.
pub const IDLE_TIMEOUT_MS_DEFAULT: u64 = 300_000;
pub const IDLE_TIMEOUT_MS_MIN: u64 = 100;
pub const IDLE_TIMEOUT_MS_MAX: u64 = 86_400_000;
/// `frame_timeout_ms`: a frame begun must be complete within this.
pub const FRAME_TIMEOUT_MS_DEFAULT: u64 = 10_000;
pub const FRAME_TIMEOUT_MS_MIN: u64 = 10;
pub const FRAME_TIMEOUT_MS_MAX: u64 = 600_000;
/// `write_timeout_ms`: a response write must finish within this.
pub const WRITE_TIMEOUT_MS_DEFAULT: u64 = 10_000;
pub const WRITE_TIMEOUT_MS_MIN: u64 = 10;
pub const WRITE_TIMEOUT_MS_MAX: u64 = 600_000;
/// `shutdown_timeout_ms`: how long a stop waits for the shards to drain.
pub const SHUTDOWN_TIMEOUT_MS_DEFAULT: u64 = 30_000;
pub const SHUTDOWN_TIMEOUT_MS_MIN: u64 = 100;
pub const SHUTDOWN_TIMEOUT_MS_MAX: u64 = 600_000;

const _: () = assert!(SHARDS_MAX >= 1);
const _: () = assert!(HOUSEKEEPING_TICK_MS_MIN >= 1);
const _: () = assert!(HOUSEKEEPING_TICK_MS_MIN <= HOUSEKEEPING_TICK_MS_DEFAULT);
const _: () = assert!(HOUSEKEEPING_TICK_MS_DEFAULT <= HOUSEKEEPING_TICK_MS_MAX);
const _: () = assert!(STARTUP_TIMEOUT_MS_MIN <= STARTUP_TIMEOUT_MS_DEFAULT);
const _: () = assert!(STARTUP_TIMEOUT_MS_DEFAULT <= STARTUP_TIMEOUT_MS_MAX);
const _: () = assert!(PARTITIONS_MAX_DEFAULT as usize <= PARTITIONS_PER_NODE_MAX);
const _: () = assert!(CONNECTIONS_PER_SHARD_DEFAULT >= 1);
const _: () = assert!(CONNECTIONS_PER_SHARD_DEFAULT <= CONNECTIONS_PER_SHARD_LIMIT);
const _: () = assert!(IN_FLIGHT_PER_CONNECTION_DEFAULT <= IN_FLIGHT_PER_CONNECTION_LIMIT);
const _: () = assert!(CLAIM_WAITERS_PER_CONNECTION_DEFAULT <= IN_FLIGHT_PER_CONNECTION_DEFAULT / 2);
const _: () = assert!(CLAIM_WAITERS_PER_CONNECTION_DEFAULT <= CLAIM_WAITERS_PER_CONNECTION_LIMIT);
const _: () = assert!(FRAME_BYTES_MAX_LOWER as usize > FRAME_HEADER_BYTES);
const _: () = assert!(FRAME_BYTES_MAX_LOWER <= FRAME_BYTES_MAX_DEFAULT);
const _: () = assert!(FRAME_BYTES_MAX_DEFAULT <= FRAME_BYTES_MAX_UPPER);
// The default frame holds a maximal batch with its header and fields, and
// the largest allowed one holds any frame the protocol defines.
const _: () = assert!(FRAME_BYTES_MAX_DEFAULT as usize >= BATCH_BYTES_MAX + FRAME_HEADER_BYTES);
const _: () = assert!(FRAME_BYTES_MAX_UPPER as usize >= MAX_FRAME_BYTES);
const _: () = assert!(IDLE_TIMEOUT_MS_MIN <= IDLE_TIMEOUT_MS_DEFAULT);
const _: () = assert!(IDLE_TIMEOUT_MS_DEFAULT <= IDLE_TIMEOUT_MS_MAX);
const _: () = assert!(FRAME_TIMEOUT_MS_MIN <= FRAME_TIMEOUT_MS_DEFAULT);
const _: () = assert!(FRAME_TIMEOUT_MS_DEFAULT <= FRAME_TIMEOUT_MS_MAX);
const _: () = assert!(WRITE_TIMEOUT_MS_MIN <= WRITE_TIMEOUT_MS_DEFAULT);
const _: () = assert!(WRITE_TIMEOUT_MS_DEFAULT <= WRITE_TIMEOUT_MS_MAX);
const _: () = assert!(SHUTDOWN_TIMEOUT_MS_MIN <= SHUTDOWN_TIMEOUT_MS_DEFAULT);
const _: () = assert!(SHUTDOWN_TIMEOUT_MS_DEFAULT <= SHUTDOWN_TIMEOUT_MS_MAX);

// --- Memory budget (`net/memory.rs`, `docs/design/memory-budget.md`) ------

/// Share of the host's memory (the machine's or the cgroup's limit,
/// whichever is lower) that `memory_bytes` defaults to: the rest is the
/// page cache's, the kernel's and other processes'.
pub const MEMORY_SHARE_PERCENT_DEFAULT: u64 = 50;
/// `memory_bytes` when the host's memory cannot be read.
pub const MEMORY_BYTES_FALLBACK: u64 = 1 << 30;
/// Largest `memory_bytes` (16 TiB).
pub const MEMORY_BYTES_MAX: u64 = 1 << 44;
/// Share of a shard's part of `memory_bytes` for request bytes: read
/// buffers above their floor and frames being handled.
pub const MEMORY_REQUESTS_PERCENT: u64 = 25;
/// Share of a shard's part of `memory_bytes` for responses produced and
/// not yet written.
pub const MEMORY_RESPONSES_PERCENT: u64 = 10;
/// A shard's requests pool must hold this many largest frames, so one
/// connection's frame can always be read beside another's.
pub const MEMORY_REQUESTS_FRAMES_MIN: u64 = 2;
/// Share of `memory_bytes` carved off the top for the admin port's pool
/// (`admin/memory.rs`), none with `admin_listen` off. 5 %: the admin port is
/// a side door, not the data path, and the shards keep 95 %; at the 1 GiB
/// fallback it holds a dozen largest API requests and answers at once.
pub const MEMORY_ADMIN_PERCENT: u64 = 5;
/// One admin API request at its largest: a body at the API's
/// `BODY_BYTES_MAX` (2 MiB) and an answer as large (asserted in
/// `admin/api/limits.rs`).
pub const MEMORY_ADMIN_REQUEST_BYTES: u64 = 4 << 20;
/// The admin pool's floor in such requests: two, so one caller's never
/// waits for ever behind another's; a budget that cannot hold it is refused.
pub const MEMORY_ADMIN_REQUESTS_MIN: u64 = 2;
/// Its ceiling: the API's `REQUESTS_IN_FLIGHT_MAX` (asserted there) can
/// never take more at once.
pub const MEMORY_ADMIN_REQUESTS_MAX: u64 = 32;

const _: () = assert!(MEMORY_SHARE_PERCENT_DEFAULT > 0 && MEMORY_SHARE_PERCENT_DEFAULT <= 100);
const _: () = assert!(MEMORY_REQUESTS_PERCENT + MEMORY_RESPONSES_PERCENT < 100);
const _: () = assert!(MEMORY_BYTES_FALLBACK <= MEMORY_BYTES_MAX);
const _: () = assert!(MEMORY_ADMIN_PERCENT > 0 && MEMORY_ADMIN_PERCENT < 50);
const _: () = assert!(MEMORY_ADMIN_REQUESTS_MIN <= MEMORY_ADMIN_REQUESTS_MAX);

// --- Control plane (`control/`): assignment table, catalog, data dir --------

/// Most partitions one queue may have: the wire's bound, so every queue the
/// broker accepts can be described in one Metadata response (OMB's largest
/// single-topic workload has 10,000 partitions).
pub const PARTITIONS_PER_QUEUE_MAX: u32 = PARTITIONS_MAX;
/// Most partitions one node may host, over all its queues. An open
/// partition holds no file descriptor of its own (its entries are in its
/// shard's journal) and, empty, a few KiB of memory (`bench/README.md`,
/// "Per-partition cost"); the bound keeps memory and start time
/// predictable on one node.
pub const PARTITIONS_PER_NODE_MAX: usize = 10_000;
/// Most queues one table (one node) may hold.
pub const QUEUES_MAX: usize = 10_000;
/// Largest catalog body. A change whose catalog would exceed it is refused
/// (`TooLarge`), and a bigger file is refused at start. 64 MiB holds the
/// largest configs at [`QUEUES_MAX`] queues with a few hundred partitions
/// each; JSON parsing of that size at start takes well under a second.
pub const CATALOG_BODY_BYTES_MAX: usize = 64 << 20;
/// Longest catalog header line, newline included.
pub const CATALOG_HEADER_BYTES_MAX: usize = 64;
/// Most bytes read from a lock file when looking for the holder's pid.
pub const LOCK_FILE_READ_BYTES_MAX: u64 = 64;
/// Most bytes read of the data directory's `format` record (a few short
/// `key = value` lines).
pub const FORMAT_FILE_READ_BYTES_MAX: u64 = 256;

// One queue may use the whole node.
const _: () = assert!(PARTITIONS_PER_QUEUE_MAX as usize <= PARTITIONS_PER_NODE_MAX);
const _: () = assert!(QUEUES_MAX >= 1);

// --- Shards (`shard/`) and what they serve (`server/`) ----------------------

/// Capacity of each control → shard channel, in batches (≥ 1024 keeps a
/// burst of admin changes from blocking the coordinator; ARCHITECTURE.md, "Platform notes").
pub const SHARD_CHANNEL_CAPACITY: usize = 1024;
/// Coordinator commands waiting for the coordinator.
pub const COORDINATOR_COMMAND_QUEUE_MAX: usize = 1024;
/// Most coordinator commands turned into one batch of updates per tick.
pub const COORDINATOR_COMMANDS_PER_TICK_MAX: usize = 256;
/// How often the main thread checks the stop flag while shards run.
pub const MAIN_POLL_INTERVAL: Duration = Duration::from_millis(20);
/// How often the control calls poll for a reply or for shards to catch up.
/// Polling (a sleep on threads, a glommio timer on executors) avoids
/// cross-executor wake-ups, which glommio 0.9 can lose (ARCHITECTURE.md, "Platform notes").
pub const COORDINATOR_POLL_INTERVAL: Duration = Duration::from_millis(1);
/// How often a starting shard checks whether it has applied the catalog's
/// replay before it starts accepting.
pub const REPLAY_WAIT_POLL: Duration = Duration::from_millis(1);
/// Table versions whose hook failures are kept for a creator to collect
/// (`shard::Shared::record_hook_failure`); older ones are dropped first. A
/// creator collects its version within [`ADMIN_APPLY_TIMEOUT_MS`] of the
/// change, long before this many later changes could be made.
pub const HOOK_FAILURE_VERSIONS_MAX: usize = 1024;
/// Failure reports kept per table version (one per shard is the most a
/// change produces; the bound only guards the map).
pub const HOOK_FAILURES_PER_VERSION_MAX: usize = 256;
/// RLIMIT_MEMLOCK needed per executor (glommio's own minimum).
pub const MEMLOCK_BYTES_PER_EXECUTOR: u64 = 512 * 1024;
/// How long a CreateQueue/DeleteQueue waits for every shard to apply it.
pub const ADMIN_APPLY_TIMEOUT_MS: u64 = 10_000;
/// How often each executor collects its heap and applies the allocator's
/// due purges (`alloc.rs`).
pub const HEAP_COLLECT_INTERVAL: Duration = Duration::from_secs(1);
/// How long freed memory stays committed before the allocator purges it
/// (mimalloc's default is 1 s; `alloc.rs`). Memory freed and reused within
/// one burst of requests is still not faulted back in page by page.
pub const ALLOC_PURGE_DELAY_MS: u32 = 250;
/// How often `spoold`'s signal thread looks at the flag its handlers set.
pub const SIGNAL_POLL: Duration = Duration::from_millis(25);

const _: () = assert!(COORDINATOR_COMMANDS_PER_TICK_MAX <= COORDINATOR_COMMAND_QUEUE_MAX);
// Freed memory is purged after the allocator's delay, at the next collection.
const _: () = assert!(ALLOC_PURGE_DELAY_MS as u128 <= HEAP_COLLECT_INTERVAL.as_millis());
const _: () = assert!(COORDINATOR_POLL_INTERVAL.as_millis() <= COORDINATOR_IDLE_POLL.as_millis());
// Every shard of the largest process can report a failure of one change.
const _: () = assert!(HOOK_FAILURES_PER_VERSION_MAX >= SHARDS_MAX as usize);
// A create waits on every shard, each polled by the coordinator at
// least every COORDINATOR_IDLE_POLL.
const _: () = assert!(ADMIN_APPLY_TIMEOUT_MS as u128 > 10 * COORDINATOR_IDLE_POLL.as_millis());

/// Connections the admin port serves at once; one more is closed on accept.
pub const ADMIN_CONNECTIONS_MAX: usize = 64;
/// A request's headers must arrive within this on the admin port.
pub const ADMIN_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest a scrape or readiness check waits for the shards' reports. A
/// report passes the coordinator (polled at least every
/// [`COORDINATOR_IDLE_POLL`]) and then a shard's channel, so this leaves room
/// for a shard busy opening partitions; a shard later than this is reported
/// missing rather than waited on.
pub const ADMIN_REPORT_TIMEOUT: Duration = Duration::from_secs(5);
/// How often the admin thread checks for the shards' reports.
pub const ADMIN_REPORT_POLL: Duration = Duration::from_millis(2);
/// How often the admin thread checks the broker's stop flag.
pub const ADMIN_STOP_POLL: Duration = Duration::from_millis(50);

const _: () = assert!(ADMIN_REPORT_TIMEOUT.as_millis() > 10 * COORDINATOR_IDLE_POLL.as_millis());
const _: () = assert!(ADMIN_REPORT_POLL.as_millis() >= 1);
const _: () = assert!(ADMIN_CONNECTIONS_MAX >= 1);

// partition and log
//
// Bounds of a partition's request paths, its checkpoints and side files, and
// its long-poll register. `partition/` re-exports the ones other modules and
// tests name. Times are milliseconds on the broker clock.

/// Furthest a producer's `enqueue_time_ms` may be from the broker clock.
pub const ENQUEUE_CLOCK_SKEW_MS_MAX: u64 = 5 * 60 * 1000;
/// Bytes read from the log per step of recovery replay.
pub const REPLAY_READ_BYTES: u64 = 8 << 20;
/// Most one claim or peek reads ahead of a record it needs (one
/// segment-file read of at most this much; see `partition/read.rs`).
pub const READ_AHEAD_BYTES_MAX: u64 = SCAN_CHUNK_BYTES;
/// Framing counted per record when sizing a read-ahead: its position-table
/// entry, archive fields and alignment.
pub const READ_AHEAD_RECORD_SLACK_BYTES: u64 = 96;
/// Table entries one checkpoint step visits before it yields the shard. An
/// entry costs ≈ 70 ns to encode (the whole-state snapshot took ≈ 70 ms
/// per million messages), so a step holds the executor well under 1 ms.
pub const CHECKPOINT_STEP_ENTRIES: usize = 8192;
/// Largest checkpoint entry: a dead letter's.
pub const CHECKPOINT_ENTRY_BYTES_MAX: usize = 72;
/// Most bytes one checkpoint step produces (its largest entry is a dead
/// letter's 72 bytes; a band count or the header adds a few): the encode
/// buffer a checkpoint holds besides the file's one write chunk.
pub const CHECKPOINT_STEP_BYTES_MAX: usize =
    CHECKPOINT_STEP_ENTRIES * CHECKPOINT_ENTRY_BYTES_MAX + 4096;
/// Log bytes appended since the last checkpoint that make the next
/// housekeeping pass write a new one.
pub const CHECKPOINT_INTERVAL_BYTES: u64 = 256 << 20;
/// Log offsets (records and events) appended since the last checkpoint that
/// also make the next housekeeping pass write one. Replay cost follows the
/// number of events, not their bytes: a small-message workload would
/// otherwise replay millions of events (256 MiB of 100-byte records) on
/// every restart. The kill loop found restart times growing without bound
/// under the byte trigger alone.
pub const CHECKPOINT_INTERVAL_OFFSETS: u64 = 1 << 16;
/// A partition holding many messages waits for more offsets than
/// [`CHECKPOINT_INTERVAL_OFFSETS`] between checkpoints: at least its held
/// messages divided by this. A checkpoint snapshots every held message
/// (≈ 70 ns each), so with a fixed interval a deep backlog paid its whole
/// snapshot again every 65,536 acks: draining 400,000 messages spent a
/// tenth of the broker's CPU in snapshots, and the cost per ack grew with
/// the backlog. With the interval a fraction of what is held, each offset
/// pays at most this many snapshot entries, whatever the depth; a restart
/// replays at most that many events on top of restoring the snapshot it
/// already reads (the same order of work), and the byte interval still
/// bounds the log a replay reads.
pub const CHECKPOINT_INTERVAL_HELD_DIVISOR: u64 = 2;
/// How often a partition whose log is out of disk space asks it to try
/// preparing the next segment again (each try writes zeros until the disk
/// is full again, so not every tick).
pub const DISK_FULL_RETRY_MS: u64 = 1_000;
/// Most events one control batch carries.
pub const CONTROL_BATCH_EVENTS_MAX: usize = 4096;
/// Bytes of batch header and position-table slack reserved per control batch
/// when asking the log for room.
pub const CONTROL_BATCH_OVERHEAD_BYTES: u64 = spool_wire::limits::BATCH_HEADER_BYTES as u64 + 8;
/// Records (enqueue) or events and tokens (claim, ack) a partition's
/// reused request scratch keeps room for between requests: a larger request
/// allocates what it needs and its scratch is dropped afterwards, so one
/// huge request does not pin its buffers for the partition's life, while
/// requests up to this size allocate nothing for their bookkeeping.
pub const REQUEST_SCRATCH_ENTRIES_MAX: usize = 1024;
/// Bytes a partition's reused control-batch builder and buffer keep
/// between appends (the same rule for bytes): a claim of 1,024 messages
/// builds a control batch of about 150 KiB.
pub const CONTROL_SCRATCH_BYTES_MAX: usize = 256 * 1024;
/// Largest write issued at once while writing a side file (checkpoint,
/// epoch).
pub const SIDE_WRITE_CHUNK_BYTES: usize = 1 << 20;
/// First write buffer of a side file; each chunk written doubles the next,
/// up to [`SIDE_WRITE_CHUNK_BYTES`]. Small, because a shard may write the
/// checkpoints of thousands of small partitions in one release pass.
pub const SIDE_WRITE_CHUNK_FIRST_BYTES: usize = 16 * 1024;
/// Largest read issued at once while reading a side file back: a checkpoint
/// of a large backlog is hundreds of MB, and O_DIRECT reads are serial here.
pub const SIDE_READ_CHUNK_BYTES: usize = 8 << 20;
/// Largest side file read back (a checkpoint of a very large backlog).
pub const SIDE_FILE_BYTES_MAX: u64 = 4 << 30;
/// Most claims that may long-poll one partition at once; a claim past it
/// returns at once with what it found (possibly nothing), so waiting clients
/// cannot grow memory without bound.
pub const CLAIM_WAITERS_MAX: usize = 4096;
/// Waiting claims each housekeeping tick wakes, in turn, while the
/// partition has ready messages: the safety net for a message the claims
/// woken for it could not take (a smaller `max_bytes`, the other lane).
/// With `w` claims waiting such a message is found within `w / 8` ticks.
pub const TICK_SWEEP_WAKES: usize = 8;
/// How soon a partition whose claims wait beside ready messages is visited
/// again for that sweep (`Partition::next_visit`): the idle tick's period,
/// so a queue with dead letters left alone and consumers long-polling its
/// main lane costs a few wakes every 100 ms, not every tick.
pub const TICK_SWEEP_INTERVAL_MS: u64 = 100;

// A producer's clock may be off by far less than how far ahead it may schedule.
const _: () = assert!(ENQUEUE_CLOCK_SKEW_MS_MAX < spool_wire::limits::SCHEDULE_HORIZON_MS);
// A replay step and a read-ahead are reads the log accepts, and a replay step
// holds at least one maximal batch.
const _: () = assert!(REPLAY_READ_BYTES <= READ_BYTES_MAX);
const _: () = assert!(REPLAY_READ_BYTES >= spool_wire::limits::BATCH_BYTES_MAX as u64);
const _: () = assert!(READ_AHEAD_BYTES_MAX <= READ_BYTES_MAX);
const _: () = assert!(READ_AHEAD_RECORD_SLACK_BYTES.is_multiple_of(8));
// A control batch of the most events, each a claim (the largest event), is a
// batch the log accepts (its records within the wire's bounds), so a full
// ack, fence, purge or tick batch is never refused for its size.
const _: () = assert!(
    CONTROL_BATCH_OVERHEAD_BYTES
        + CONTROL_BATCH_EVENTS_MAX as u64 * (crate::queue::CLAIMED_EVENT_BYTES as u64 + 8)
        <= spool_wire::limits::BATCH_BYTES_MAX as u64
);
const _: () =
    assert!(CONTROL_BATCH_EVENTS_MAX as u64 <= spool_wire::limits::BATCH_RECORDS_MAX as u64);
const _: () =
    assert!(crate::queue::CLAIMED_EVENT_BYTES <= spool_wire::limits::CONTROL_RECORD_BYTES_MAX);
const _: () = assert!(crate::queue::EVENT_BYTES <= crate::queue::CLAIMED_EVENT_BYTES);
// A scratch kept for the largest claim's control batch fits its byte cap.
const _: () = assert!(
    REQUEST_SCRATCH_ENTRIES_MAX * (crate::queue::CLAIMED_EVENT_BYTES + 8 + 16)
        <= CONTROL_SCRATCH_BYTES_MAX
);
// A checkpoint step's output fits the side file's one write chunk, and both
// side-file chunks are whole O_DIRECT pages.
const _: () = assert!(CHECKPOINT_STEP_ENTRIES >= 1);
const _: () = assert!(CHECKPOINT_STEP_BYTES_MAX <= SIDE_WRITE_CHUNK_BYTES);
const _: () = assert!((SIDE_WRITE_CHUNK_BYTES as u64).is_multiple_of(PAGE_BYTES));
const _: () = assert!((SIDE_WRITE_CHUNK_FIRST_BYTES as u64).is_multiple_of(PAGE_BYTES));
const _: () = assert!(SIDE_WRITE_CHUNK_FIRST_BYTES <= SIDE_WRITE_CHUNK_BYTES);
const _: () = assert!(SIDE_WRITE_CHUNK_FIRST_BYTES > 32);
const _: () = assert!((SIDE_READ_CHUNK_BYTES as u64).is_multiple_of(PAGE_BYTES));
const _: () = assert!(SIDE_READ_CHUNK_BYTES as u64 <= SIDE_FILE_BYTES_MAX);
// A checkpoint falls due no more often than a default segment fills, so each
// one can let whole segments go.
const _: () = assert!(CHECKPOINT_INTERVAL_BYTES >= SEGMENT_BYTES_DEFAULT);
const _: () = assert!(CHECKPOINT_INTERVAL_OFFSETS >= 1);
const _: () = assert!(CHECKPOINT_INTERVAL_HELD_DIVISOR >= 1);
const _: () = assert!(DISK_FULL_RETRY_MS > 0);
// The tick's sweep wakes some but not all of a full register; the register's
// size travels as a u32 (`control::config`).
const _: () = assert!(TICK_SWEEP_WAKES >= 1 && TICK_SWEEP_WAKES <= CLAIM_WAITERS_MAX);
const _: () = assert!(CLAIM_WAITERS_MAX <= u32::MAX as usize);

// authentication and authorization

/// Most principals an auth file may name.
pub const PRINCIPALS_MAX: usize = 10_000;
/// Most ACL rules an auth file may hold.
pub const ACL_RULES_MAX: usize = 100_000;
/// Bytes of random salt in a secret hash (argon2's recommended 16): the
/// client's value, since `spool auth hash-secret` makes the hashes the
/// broker checks and makes.
pub use spool_client::limits::SALT_BYTES;
/// Most queues one connection's rights cache holds (by name, and by id);
/// past it the cache is emptied and fills again.
pub const SESSION_RIGHTS_CACHE_MAX: usize = 1024;
const _: () = assert!(SESSION_RIGHTS_CACHE_MAX > 0);
/// Failed logins (refused Authenticate handshakes, refused HTTP bearer
/// tokens) from one source IP within [`AUTH_FAILURE_WINDOW`] after which
/// that address is locked out for a window: its further attempts are
/// refused at once, without running argon2 (`auth::limiter`).
pub const AUTH_FAILURES_MAX: u32 = 5;
/// The window [`AUTH_FAILURES_MAX`] is counted in, and how long a lockout
/// lasts from the failure that started it.
pub const AUTH_FAILURE_WINDOW: Duration = Duration::from_secs(10);
/// Most source addresses one failed-login table remembers (one table per
/// shard and one for the admin port); past it the address whose last
/// failure is oldest is forgotten.
pub const AUTH_FAILURE_TABLE_MAX: usize = 4096;
/// Longest a reload of the auth file waits for every shard to take the new
/// policy before it answers that some have not yet.
pub const AUTH_RELOAD_TIMEOUT: Duration = Duration::from_secs(10);
const _: () = assert!(AUTH_FAILURES_MAX >= 1 && AUTH_FAILURE_TABLE_MAX >= 1);
const _: () = assert!(AUTH_FAILURE_WINDOW.as_millis() >= 1);

// quotas per principal (`auth::quota`, `server::quota`)

/// Highest `enqueue_messages_per_sec` an auth file may set (node-wide).
pub const QUOTA_MESSAGES_PER_SEC_MAX: u64 = 100_000_000;
/// Highest `enqueue_bytes_per_sec` an auth file may set (node-wide: 1 TiB/s).
pub const QUOTA_BYTES_PER_SEC_MAX: u64 = 1 << 40;
/// Highest `claims_in_flight_max` an auth file may set (node-wide). Each
/// shard's table of claims in flight holds at most its share of this per
/// principal with the quota.
pub const QUOTA_CLAIMS_IN_FLIGHT_MAX: u64 = 1_000_000;
/// Highest `stored_messages_max` an auth file may set (node-wide).
pub const QUOTA_STORED_MESSAGES_MAX: u64 = 1 << 40;
/// Highest `stored_bytes_max` an auth file may set (node-wide: 1 PiB).
pub const QUOTA_STORED_BYTES_MAX: u64 = 1 << 50;
/// The retry hint of a claim refused while only other claims' reservations
/// (long-polls still waiting) hold the principal's share.
pub const QUOTA_CLAIM_RETRY_MS: u64 = 100;
const _: () = assert!(QUOTA_CLAIM_RETRY_MS > 0);
// Scaled bucket amounts (`auth::quota::Bucket`) stay far inside i128.
const _: () = assert!(QUOTA_BYTES_PER_SEC_MAX <= u64::MAX / 1000);
