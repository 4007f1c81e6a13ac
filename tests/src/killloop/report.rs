//! What a kill-loop run saw ([`KillLoopReport`], and its JSON), and where
//! each armed failpoint fired.

use super::ledger::{Activity, Violations};

/// Where an armed failpoint fired.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FiredAt {
    /// While the broker was starting (recovery, epoch bump, preparing).
    Startup,
    /// While serving the load.
    Load,
    /// During the SIGTERM drain (final checkpoint, retention).
    Close,
    /// Not reached: the broker started, served and stopped cleanly.
    Missed,
}

/// What one failpoint cycle saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailpointOutcome {
    /// The point.
    pub point: String,
    /// Where it fired.
    pub fired_at: FiredAt,
}

/// What a run saw. [`violations`](Self::violations) must be all zero.
#[derive(Debug, Clone)]
pub struct KillLoopReport {
    /// The seed.
    pub seed: u64,
    /// Kills performed (each followed by a restart and a check).
    pub kills: u32,
    /// Wall time of the whole run.
    pub duration_s: f64,
    /// Acknowledged enqueues accounted for at the end.
    pub acked_enqueues_checked: u64,
    /// Acks acknowledged (workers and drain).
    pub acks_acknowledged: u64,
    /// Distinct partitions that received an acknowledged enqueue.
    pub partitions_used: u32,
    /// Messages the final drain claimed and acked.
    pub drained: u64,
    /// Dead letters at the end.
    pub dead_letters: u64,
    /// Witness tokens tried after a restart.
    pub witness_tokens_tried: u64,
    /// Of those, tried while their lease had not yet run out.
    pub witness_tokens_unexpired: u64,
    /// Of those, refused with `STALE_TOKEN` or `INVALID_TOKEN`.
    pub witness_tokens_refused: u64,
    /// Restarts that had to wait for the killed broker's ports to be
    /// bindable again (see `wait_ports_free`).
    pub port_waits: u64,
    /// Restart time (kill to every shard accepting), median and maximum.
    pub restart_ms_p50: u64,
    /// See [`restart_ms_p50`](Self::restart_ms_p50).
    pub restart_ms_max: u64,
    /// Violation counts.
    pub violations: Violations,
    /// Activity counters of the ledger.
    pub activity: Activity,
    /// Enqueue resends after an unanswered request.
    pub enqueue_retries: u64,
    /// Records refused for good.
    pub enqueue_rejected: u64,
    /// Worker acks refused as stale or invalid (lease ran out or a kill).
    pub acks_refused: u64,
    /// Worker acks refused with another code.
    pub acks_refused_other: u64,
    /// Releases and extends answered with success.
    pub releases: u64,
    /// See [`releases`](Self::releases).
    pub extends: u64,
    /// Deliveries left to expire on purpose.
    pub abandoned: u64,
    /// Ordered mode: sessions the consumers opened.
    pub sessions_opened: u64,
    /// Ordered mode: consumer lives ended by dropping their connections.
    pub connections_dropped: u64,
    /// Ordered mode: deliveries held when their connection was dropped.
    pub held_at_drop: u64,
    /// Examples of violations.
    pub samples: Vec<String>,
    /// Failpoint mode: where each armed point fired.
    pub failpoints: Vec<FailpointOutcome>,
    /// The second subscription's own accounting, when the run had one.
    pub subscription: Option<SubscriptionReport>,
}

/// What the second subscription's ledger saw
/// ([`KillLoopConfig::subscription`](super::KillLoopConfig::subscription)).
#[derive(Debug, Clone)]
pub struct SubscriptionReport {
    /// Its name.
    pub name: String,
    /// Acknowledged enqueues accounted for in it at the end.
    pub acked_enqueues_checked: u64,
    /// Acks acknowledged in it (workers and drain).
    pub acks_acknowledged: u64,
    /// Messages its final drain claimed and acked.
    pub drained: u64,
    /// Its dead letters at the end.
    pub dead_letters: u64,
    /// Its violation counts.
    pub violations: Violations,
    /// Its ledger's activity counters.
    pub activity: Activity,
    /// Examples of its violations.
    pub samples: Vec<String>,
}

impl KillLoopReport {
    /// Sum of all violation counts, the second subscription's included.
    pub fn violations_total(&self) -> u64 {
        self.violations.total() + self.subscription.as_ref().map_or(0, |sub| sub.violations.total())
    }

    /// The report as one JSON object.
    pub fn to_json(&self) -> serde_json::Value {
        let v = &self.violations;
        let a = &self.activity;
        let mut json = serde_json::json!({
            "seed": self.seed,
            "kills": self.kills,
            "duration_s": (self.duration_s * 10.0).round() / 10.0,
            "acked_enqueues_checked": self.acked_enqueues_checked,
            "acks_acknowledged": self.acks_acknowledged,
            "partitions_used": self.partitions_used,
            "deliveries": a.deliveries,
            "drained": self.drained,
            "dead_letters": self.dead_letters,
            "lost": v.lost,
            "redelivered_after_ack": v.redelivered_after_ack,
            "acked_but_live": v.acked_but_live,
            "stale_tokens_accepted": v.stale_tokens_accepted,
            "dedupe_conflicts": v.dedupe_conflicts,
            "offset_conflicts": v.offset_conflicts,
            "generation_reused": v.generation_reused,
            "phantom_deliveries": v.phantom_deliveries,
            "dead_letters_unaccounted": v.dead_letters_unaccounted,
            "violations_total": self.violations_total(),
            "witness_tokens_tried": self.witness_tokens_tried,
            "witness_tokens_unexpired": self.witness_tokens_unexpired,
            "witness_tokens_refused": self.witness_tokens_refused,
            "live_checks": a.live_checks,
            "ack_unknown_applied": a.ack_unknown_applied,
            "ack_unknown_not_applied": a.ack_unknown_not_applied,
            "duplicates_answered": a.duplicates_answered,
            "enqueue_retries": self.enqueue_retries,
            "enqueue_rejected": self.enqueue_rejected,
            "acks_refused": self.acks_refused,
            "acks_refused_other": self.acks_refused_other,
            "releases": self.releases,
            "extends": self.extends,
            "abandoned": self.abandoned,
            "port_waits": self.port_waits,
            "restart_ms_p50": self.restart_ms_p50,
            "restart_ms_max": self.restart_ms_max,
            "samples": self.samples,
            "failpoints": self.failpoints.iter().map(|outcome| {
                serde_json::json!({ "point": outcome.point, "fired_at": format!("{:?}", outcome.fired_at) })
            }).collect::<Vec<_>>(),
            "subscription": self.subscription.as_ref().map(SubscriptionReport::to_json),
        });
        // Ordered mode's counters (one macro call this big would pass the
        // macro recursion limit).
        let ordered = [
            ("key_order_regressions", v.key_order_regressions),
            ("key_overlaps", v.key_overlaps),
            ("key_handovers", a.key_handovers),
            ("sessions_opened", self.sessions_opened),
            ("connections_dropped", self.connections_dropped),
            ("held_at_drop", self.held_at_drop),
        ];
        if let Some(object) = json.as_object_mut() {
            for (name, count) in ordered {
                object.insert(name.to_owned(), count.into());
            }
        }
        json
    }
}

/// The `percent` percentile of `sorted` (0 when empty).
pub(super) fn percentile_ms(sorted: &[u64], percent: usize) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    sorted[(sorted.len() - 1) * percent / 100]
}

impl SubscriptionReport {
    /// The report as one JSON object.
    pub fn to_json(&self) -> serde_json::Value {
        let (v, a) = (&self.violations, &self.activity);
        serde_json::json!({
            "name": self.name,
            "acked_enqueues_checked": self.acked_enqueues_checked,
            "acks_acknowledged": self.acks_acknowledged,
            "deliveries": a.deliveries,
            "drained": self.drained,
            "dead_letters": self.dead_letters,
            "lost": v.lost,
            "redelivered_after_ack": v.redelivered_after_ack,
            "acked_but_live": v.acked_but_live,
            "stale_tokens_accepted": v.stale_tokens_accepted,
            "dedupe_conflicts": v.dedupe_conflicts,
            "offset_conflicts": v.offset_conflicts,
            "generation_reused": v.generation_reused,
            "phantom_deliveries": v.phantom_deliveries,
            "dead_letters_unaccounted": v.dead_letters_unaccounted,
            "key_order_regressions": v.key_order_regressions,
            "key_overlaps": v.key_overlaps,
            "violations_total": v.total(),
            "ack_unknown_applied": a.ack_unknown_applied,
            "ack_unknown_not_applied": a.ack_unknown_not_applied,
            "samples": self.samples,
        })
    }
}
