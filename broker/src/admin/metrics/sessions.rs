//! The consumer sessions' families (`docs/design/sessions.md`), per shard:
//! sessions open, opened, ended by cause, claims tracked, and claims their
//! sessions' ends released.

use prometheus_client::registry::Registry;

use super::{gauge_value, Counters, Gauges, ShardLabels, ShardReasonLabels};
use crate::shard::report::{ShardReport, SESSION_END_CAUSES};

/// Registers the `spool_sessions_*` and `spool_session_*` families from
/// `reports`.
pub(super) fn register_sessions(registry: &mut Registry, reports: &[ShardReport]) {
    let open = Gauges::<ShardLabels>::default();
    let tracked = Gauges::<ShardLabels>::default();
    let opened = Counters::<ShardLabels>::default();
    let released = Counters::<ShardLabels>::default();
    let ended = Counters::<ShardReasonLabels>::default();
    for shard in reports {
        let labels = ShardLabels { shard: shard.shard.0.to_string() };
        let figures = &shard.sessions;
        open.get_or_create(&labels).set(gauge_value(figures.open));
        tracked.get_or_create(&labels).set(gauge_value(figures.claims_tracked));
        opened.get_or_create(&labels).inc_by(figures.opened);
        released.get_or_create(&labels).inc_by(figures.claims_released);
        // Every cause, 0 included: a rate() over a series that appears
        // only at its first end misses that end.
        for (cause, count) in SESSION_END_CAUSES.iter().zip(figures.ended) {
            let labels =
                ShardReasonLabels { shard: shard.shard.0.to_string(), reason: (*cause).to_owned() };
            ended.get_or_create(&labels).inc_by(count);
        }
    }
    registry.register("spool_sessions_open", "Consumer sessions open on the shard", open);
    registry.register(
        "spool_session_claims_tracked",
        "Claims the shard's open consumer sessions hold (released at once when their session ends)",
        tracked,
    );
    registry.register("spool_sessions_opened", "Consumer sessions opened on the shard", opened);
    registry.register(
        "spool_sessions_ended",
        "Consumer sessions that ended, by reason (closed, connection, timeout, replaced)",
        ended,
    );
    registry.register(
        "spool_session_claims_released",
        "Claims released at once (reason session ended) because their consumer session ended",
        released,
    );
}
