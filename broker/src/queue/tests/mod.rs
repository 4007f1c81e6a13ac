//! Tests of the queue state machine: behaviour tests (one per contract
//! bullet) and the seeded model test against a naive reference.

mod behaviour;
mod fence;
mod harness;
mod model;
