//! `spoold-failpoints`: `spoold` built with the `failpoints` feature, for
//! fault tests only (`SPOOL_FAILPOINTS`, see `spool_broker::failpoint`). A
//! separate binary so the ordinary `spoold` never carries the hooks.

#[path = "spoold.rs"]
mod spoold;

fn main() {
    spoold::main();
}
