//! Spool's capacity planner and host checks.
//!
//! [`plan`] is the capacity model of DESIGN.md §7 as a pure function: workload
//! in ([`PlanInputs`], defaults = the seed's 25k/s model), capacity and broker
//! settings out ([`Plan`]), typed errors ([`PlanError`]) for inputs that have
//! no meaningful plan. [`settings`] turns the model into broker settings,
//! [`report`] renders tables, and [`host`] checks (and optionally tunes) the
//! machine a broker will run on. The binary `spool-plan` is a thin CLI over
//! these.
//!
//! This crate does not run a broker or measure anything: the bench crate
//! reproduces the model by running it; this one only computes it.

pub mod host;
pub mod plan;
pub mod report;
pub mod settings;

pub use plan::{plan, Plan, PlanError, PlanInputs};
