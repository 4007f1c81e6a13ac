//! Spool's capacity planner and host checks.
//!
//! [`plan`] is the capacity model (docs/capacity.md) as a pure function: workload
//! in ([`PlanInputs`], defaults = the seed's 25k/s model), capacity and broker
//! settings out ([`Plan`]), typed errors ([`PlanError`]) for inputs that have
//! no meaningful plan. [`settings`] turns the model into broker settings,
//! [`report`] renders tables, and [`host`] checks (and optionally tunes) the
//! machine a broker will run on. [`measure`] times what decides the model on
//! this host (fdatasync beside the node's ingress, the broker's CPU per
//! message from a short run of `spoold` under `spool-bench`), and
//! [`verdict`] says, purely, whether those figures carry the plan. The
//! binary `spool-plan` is a thin CLI over these.
//!
//! Only [`measure`] does I/O beyond reading the host's /proc and /sys, and
//! only it reads a clock ([`clock`]); the planner and the verdict are pure.
//! This crate does not reproduce the model under load: `spool-bench
//! capacity` does, and reads the host's limits from `spool-plan host --json`.

pub mod clock;
pub mod host;
pub mod measure;
pub mod plan;
pub mod report;
pub mod settings;
pub mod verdict;

pub use plan::{plan, Plan, PlanError, PlanInputs};
