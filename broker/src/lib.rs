//! The Spool broker.
//!
//! Modules in the order a request meets them: `partition` orders the steps
//! (decide, append, sync, reply), `queue` is the pure state machine, `log` holds
//! segments, group commit and recovery, `io` is the storage seam (glommio DMA
//! files and a simulated disk). Only `io` (and later `net` and the shard
//! bootstrap) name glommio.

pub mod queue;
