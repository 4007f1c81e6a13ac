//! Tests of the queue state machine: behaviour tests (one per contract
//! bullet), the seeded model test against a naive reference, and the
//! commutation test of the journal's control lane.

mod behaviour;
mod checkpoint_bytes;
mod commutation;
mod fence;
mod harness;
mod model;
mod ordered;
mod subscriptions;
mod window;
