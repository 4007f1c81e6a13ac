//! The Spool broker.
//!
//! Modules in the order a request meets them: `net` accepts connections and
//! moves frames in and out, `server` decodes the Spool protocol and hands
//! each request to the partition this shard owns, `shard` runs one pinned
//! executor per core and is the only code that sees other cores, `partition`
//! orders the steps
//! (decide, append, sync, reply), `queue` is the pure state machine, `log`
//! holds segments, group commit and recovery, `io` is the storage seam
//! (glommio DMA files and a simulated disk). `control` holds config, the
//! data-dir lock and secret, and the assignment table; `fatal` is the one
//! way the process stops on its own; `admin` serves the admin port (metrics,
//! health) on its own thread, reaching the shards only by message; `failpoint` holds the test-only
//! fault hooks (armed only with the `failpoints` feature); `limits` names
//! every bound of the broker, with their relations checked at compile time;
//! `clock` is the one place that reads time. Only `io`, `net`,
//! `server`, the shard bootstrap and the binaries name glommio
//! (`tests/tests/tidy.rs` checks it).

pub mod admin;
pub mod alloc;
pub mod auth;
pub mod clock;
pub mod control;
pub mod failpoint;
pub mod fatal;
pub mod io;
pub mod limits;
pub mod log;
pub mod net;
pub mod partition;
pub mod queue;
pub mod replica;
pub mod server;
pub mod shard;
