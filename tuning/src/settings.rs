//! Broker settings recommended from a plan: commit window and size, segment
//! size, admission limits, disk reserve and the claim lease.
//!
//! This module owns the rules that turn the model's rates into settings, each
//! with its reason and its named bounds. It does not validate workload inputs
//! ([`crate::plan`] does that before calling [`recommend`]) and does not write
//! any configuration file: the broker's config owns its own format.

use serde::{Deserialize, Serialize};

/// No commit window: measured, an explicit wait only adds latency — a
/// commit takes what arrived while the previous sync ran.
pub const COMMIT_WINDOW_US: u64 = 0;
/// Unit of every disk write (O_DIRECT, one commit per fresh page): the
/// broker's `PAGE_BYTES`, written again here so the planner builds without
/// the broker (`spool-plan` runs on hosts that have no broker build);
/// `spool-bench` asserts at compile time that the two agree.
pub const PAGE_BYTES: u64 = 4096;
/// Smallest commit cap: below this a burst of small records splits into
/// several syncs for no gain.
pub const COMMIT_BYTES_RECOMMENDED_MIN: u64 = 64 * 1024;
/// Largest commit cap: one write of this size is ≈2 ms at the measured
/// 1.2–2.3 GB/s, about one slow sync; more only delays the waiters.
pub const COMMIT_BYTES_RECOMMENDED_MAX: u64 = 4 * 1024 * 1024;
/// A commit should hold what one partition receives during this many slow syncs.
pub const COMMIT_HEADROOM: f64 = 2.0;
/// A segment holds about this many seconds of one partition's peak ingress,
/// so retention frees space in steps of about a minute.
pub const SEGMENT_SPAN_S: f64 = 60.0;
/// Smallest segment: fewer, larger files keep handles and index entries few.
pub const SEGMENT_BYTES_RECOMMENDED_MIN: u64 = 16 * 1024 * 1024;
/// Largest segment recommended: the broker's own `SEGMENT_BYTES_MAX`
/// (asserted equal in `spool-bench`).
pub const SEGMENT_BYTES_RECOMMENDED_MAX: u64 = 1 << 30;
/// Admission allows this many planned bursts of backlog.
pub const ADMISSION_HEADROOM: f64 = 2.0;
/// Admission allows at least this many seconds of peak ingress, so a plan with
/// no burst backlog still gets a usable limit.
pub const ADMISSION_FLOOR_S: f64 = 60.0;
/// Broker memory per never-claimed message (the queue state's target, `spool-bench state-memory`).
pub const INDEX_BYTES_PER_MSG: f64 = 32.0;
/// Standard normal quantile at 0.999: the lease covers the service-time p99.9.
pub const Z_P999: f64 = 3.090_232_306_167_813;
/// Shortest lease recommended: below a second, network round trips and
/// extension traffic rather than the handler decide when claims expire.
pub const LEASE_MS_RECOMMENDED_MIN: u64 = 1000;

const _: () = assert!(
    COMMIT_BYTES_RECOMMENDED_MIN.is_power_of_two()
        && COMMIT_BYTES_RECOMMENDED_MAX.is_power_of_two()
);
const _: () = assert!(
    SEGMENT_BYTES_RECOMMENDED_MIN.is_power_of_two()
        && SEGMENT_BYTES_RECOMMENDED_MAX.is_power_of_two()
);
const _: () = assert!(COMMIT_BYTES_RECOMMENDED_MIN.is_multiple_of(PAGE_BYTES));

/// What [`recommend`] needs from a validated plan.
#[derive(Debug, Clone, PartialEq)]
pub struct SettingsInputs {
    pub ingress_bytes_per_s_per_partition: f64,
    pub record_bytes: f64,
    pub sync_slow_ms: f64,
    pub backlog_msgs: f64,
    pub rate_msgs_per_s: f64,
    pub disk_bytes_per_replica: f64,
    pub disk_reserve_fraction: f64,
    pub service_ms_mean: f64,
    pub service_cv: f64,
    pub lease_safety_factor: f64,
}

/// The claim lease derived from the service-time tail.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LeasePlan {
    /// σ of ln(service time): √ln(1 + CV²).
    pub sigma: f64,
    /// μ of ln(service time in ms): ln(mean) − σ²/2.
    pub mu: f64,
    /// exp(μ + z₀.₉₉₉ σ).
    pub service_p999_ms: f64,
    /// p99.9 × safety factor, before the floor.
    pub lease_tail_ms: f64,
    /// max(⌈lease_tail_ms⌉, LEASE_MS_RECOMMENDED_MIN).
    pub lease_ms: u64,
    /// The formula with this plan's numbers in it.
    pub formula: String,
}

/// Settings for `spoold` derived from the plan.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BrokerSettings {
    pub commit_window_us: u64,
    /// Most bytes one group commit gathers.
    pub commit_bytes: u64,
    pub segment_bytes: u64,
    /// Per-queue admission limit (messages).
    pub queue_max_messages: u64,
    /// Per-queue admission limit (bytes).
    pub queue_max_bytes: u64,
    /// Disk kept free by each broker.
    pub disk_reserve_bytes: u64,
    /// Broker memory to index the burst backlog.
    pub backlog_index_bytes: u64,
    pub lease: LeasePlan,
}

/// Derives broker settings from a validated plan.
pub fn recommend(inputs: &SettingsInputs) -> BrokerSettings {
    let commit_need =
        inputs.ingress_bytes_per_s_per_partition * inputs.sync_slow_ms / 1000.0 * COMMIT_HEADROOM;
    // A commit must hold at least one record.
    let commit_bytes = pow2_within(
        commit_need.max(inputs.record_bytes),
        COMMIT_BYTES_RECOMMENDED_MIN,
        COMMIT_BYTES_RECOMMENDED_MAX,
    );
    let segment_bytes = pow2_within(
        inputs.ingress_bytes_per_s_per_partition * SEGMENT_SPAN_S,
        SEGMENT_BYTES_RECOMMENDED_MIN,
        SEGMENT_BYTES_RECOMMENDED_MAX,
    );
    let queue_max_messages = (inputs.backlog_msgs * ADMISSION_HEADROOM)
        .max(inputs.rate_msgs_per_s * ADMISSION_FLOOR_S)
        .ceil();
    // Float-to-int casts saturate; the plan's input limits keep these far below u64::MAX.
    let queue_max_bytes = round_up_pages(queue_max_messages * inputs.record_bytes);
    BrokerSettings {
        commit_window_us: COMMIT_WINDOW_US,
        commit_bytes,
        segment_bytes,
        queue_max_messages: queue_max_messages as u64,
        queue_max_bytes,
        disk_reserve_bytes: round_up_pages(
            inputs.disk_bytes_per_replica * inputs.disk_reserve_fraction,
        ),
        backlog_index_bytes: (inputs.backlog_msgs * INDEX_BYTES_PER_MSG).ceil() as u64,
        lease: lease(inputs.service_ms_mean, inputs.service_cv, inputs.lease_safety_factor),
    }
}

/// Log-normal parameters (σ, μ) with the given mean and coefficient of variation.
pub fn lognormal_params(mean: f64, cv: f64) -> (f64, f64) {
    let sigma_squared = (1.0 + cv * cv).ln();
    (sigma_squared.sqrt(), mean.ln() - sigma_squared / 2.0)
}

/// Quantile of a log-normal with the given mean and CV at standard-normal score `z`.
pub fn lognormal_quantile(mean: f64, cv: f64, z: f64) -> f64 {
    let (sigma, mu) = lognormal_params(mean, cv);
    (mu + z * sigma).exp()
}

/// The lease: service-time p99.9 (log-normal) × safety factor, floored.
pub fn lease(service_ms_mean: f64, service_cv: f64, safety_factor: f64) -> LeasePlan {
    let (sigma, mu) = lognormal_params(service_ms_mean, service_cv);
    let service_p999_ms = lognormal_quantile(service_ms_mean, service_cv, Z_P999);
    let lease_tail_ms = service_p999_ms * safety_factor;
    let lease_ms = (lease_tail_ms.ceil() as u64).max(LEASE_MS_RECOMMENDED_MIN);
    let formula = format!(
        "lease = max(p99.9 x k, {LEASE_MS_RECOMMENDED_MIN} ms); p99.9 = exp(mu + {Z_P999:.4} sigma), \
         sigma = sqrt(ln(1 + CV^2)) = {sigma:.4}, mu = ln(mean_ms) - sigma^2/2 = {mu:.4} \
         -> p99.9 = {service_p999_ms:.1} ms, x k={safety_factor} = {lease_tail_ms:.1} ms"
    );
    LeasePlan { sigma, mu, service_p999_ms, lease_tail_ms, lease_ms, formula }
}

/// Rounds `bytes` up to a power of two, then into [min, max].
fn pow2_within(bytes: f64, min: u64, max: u64) -> u64 {
    let wanted = (bytes.ceil() as u64).clamp(min, max);
    // `max` is a power of two, so the next power of two of a value <= max is <= max.
    wanted.next_power_of_two()
}

fn round_up_pages(bytes: f64) -> u64 {
    (bytes.ceil() as u64).div_ceil(PAGE_BYTES).saturating_mul(PAGE_BYTES)
}

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: the log-normal parameters reproduce the requested mean and CV.
    // Method: compare exp(μ + σ²/2) and √(exp(σ²) − 1) with the inputs.
    #[test]
    fn lognormal_params_match_mean_and_cv() {
        for (mean, cv) in [(18.0, 1.0), (40_000.0, 0.25), (1.0, 3.0)] {
            let (sigma, mu) = lognormal_params(mean, cv);
            let mean_back = (mu + sigma * sigma / 2.0).exp();
            let cv_back = ((sigma * sigma).exp() - 1.0).sqrt();
            assert!((mean_back - mean).abs() / mean < 1e-12, "{mean} {cv}");
            assert!((cv_back - cv).abs() < 1e-12, "{mean} {cv}");
        }
    }

    // Goal: the lease for the seed's 18 ms, CV 1, k = 2 is the hand-computed value.
    // Method: p99.9 = exp(ln 18 − ln2/2 + 3.0902·√ln2) ≈ 166.8 ms, lease tail ≈ 333.6 ms,
    // floored to 1000 ms; with CV 0 the tail collapses to the mean.
    #[test]
    fn lease_from_tail_matches_hand_computation() {
        let lease_plan = lease(18.0, 1.0, 2.0);
        assert!((lease_plan.service_p999_ms - 166.78).abs() < 0.05, "{lease_plan:?}");
        assert!((lease_plan.lease_tail_ms - 333.56).abs() < 0.1, "{lease_plan:?}");
        assert_eq!(lease_plan.lease_ms, LEASE_MS_RECOMMENDED_MIN);
        let no_variance = lease(18.0, 0.0, 2.0);
        assert!((no_variance.service_p999_ms - 18.0).abs() < 1e-9);
        let slow = lease(40_000.0, 0.5, 1.5);
        assert_eq!(slow.lease_ms, slow.lease_tail_ms.ceil() as u64);
        assert!(slow.lease_ms > 40_000);
    }

    // Goal: power-of-two sizing stays inside its bounds and rounds up.
    // Method: values below, inside and above the range.
    #[test]
    fn pow2_within_rounds_up_and_clamps() {
        assert_eq!(
            pow2_within(1.0, COMMIT_BYTES_RECOMMENDED_MIN, COMMIT_BYTES_RECOMMENDED_MAX),
            COMMIT_BYTES_RECOMMENDED_MIN
        );
        assert_eq!(
            pow2_within(81_920.0, COMMIT_BYTES_RECOMMENDED_MIN, COMMIT_BYTES_RECOMMENDED_MAX),
            128 * 1024
        );
        assert_eq!(
            pow2_within(1e15, COMMIT_BYTES_RECOMMENDED_MIN, COMMIT_BYTES_RECOMMENDED_MAX),
            COMMIT_BYTES_RECOMMENDED_MAX
        );
        assert_eq!(round_up_pages(1.0), PAGE_BYTES);
        assert_eq!(round_up_pages(8192.0), 8192);
    }
}
