//! Spool's load generators and benchmarks.
//!
//! What it owns: scenarios that drive a Spool component as hard as a real
//! workload would and report one JSON object per run, so results can be
//! diffed and compared against the disk's own limits (fio). What it does not
//! do: judge results (no thresholds here; the lead compares reports) or touch
//! broker internals beyond their public API.
//!
//! Scenarios:
//! - [`log_append`]: one glommio shard, N appenders on one partition log,
//!   append → durable latency and group-commit throughput.
//! - [`state_memory`]: heap bytes per message of the pure queue state
//!   machine (backlog, dedupe, claimed, scheduled) and its enqueue fold rate.
//! - [`recovery`]: reopen time of a large on-disk partition with and
//!   without a checkpoint.
//! - [`throughput`]: producers and consumers over the real client against a
//!   `spoold`: enqueue and claim+ack rates, enqueue and end-to-end latency.
//! - [`latency_scenario`], [`capacity`], [`omb`]: phased open-loop load with
//!   simulated workers on the [`load`] engine — a fixed rate, the capacity
//!   model's burst and drain against the planner's prediction, and
//!   OpenMessaging Benchmark workload files — sampled every second, with a
//!   progress bar and an SVG [`plot`]. [`harness`] starts and stops the
//!   `spoold` these and `throughput` run against.
//!
//! - [`redis_streams`]: the peer, Redis Streams (XADD / XREADGROUP /
//!   XACK over the [`resp`] codec) driven with `throughput`'s shape, for
//!   side-by-side runs in one sitting (`bench/scripts/peer.sh`).
//! - [`rss`]: the started `spoold`'s resident memory at each of a series of
//!   backlogs, after the drain, and after a settle period.
//! - [`memory_attack`]: the started `spoold`'s resident memory against
//!   connections holding unfinished frames, with and without its memory
//!   budget, and how soon it comes back once they close.
//! - [`failover`]: three `spoold` nodes in a cluster it starts; the leader
//!   of a one-partition queue SIGKILLed, N times: kill → first acknowledged
//!   enqueue, and a drain that checks nothing acknowledged was lost.
//!
//! [`pinned`] is the frame of the in-process disk scenarios (a fresh run
//! directory, one pinned glommio executor).
//! [`sends`] is the send side `throughput` and [`load`] share (the
//! timestamped payload, a pacer's window wait, the collector of its sends).
//! [`error`] names only the in-process scenarios' failures; the client
//! scenarios keep their own error enums, gathered by the binary.
//!
//! [`heap`] holds the counting allocator the binary installs for
//! `state_memory`; the criterion micro-benchmarks of the state machine live
//! beside it in `broker/benches/queue.rs`.

pub mod capacity;
pub mod dist;
pub mod error;
pub mod failover;
pub mod harness;
pub mod heap;
pub mod histogram;
pub mod hostile;
pub mod idle;
pub mod latency_scenario;
pub mod load;
pub mod log_append;
pub mod memory_attack;
pub mod omb;
pub mod pinned;
pub mod plot;
pub mod recovery;
pub mod redis_streams;
pub mod resp;
pub mod rss;
pub mod security;
pub mod sends;
pub mod state_memory;
pub mod takeover;
pub mod throughput;
pub mod timed;

pub use error::BenchError;
