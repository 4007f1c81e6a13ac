//! The one-second sampler: the client's counts beside the broker's
//! (DescribeQueue over the run's queues), the interval's rates and latency
//! percentiles, and the progress bar it keeps current.

use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use spool_client::{Admin, ClientError, ConsumerStats};

use super::config::{LoadConfig, SAMPLES_MAX};
use super::recorder::Recorder;
use super::report::{BacklogCheck, BrokerCounts, Sample};
use super::workers::Workers;

/// DescribeQueue requests of one sample in flight at once.
const DESCRIBE_CONCURRENCY: usize = 32;

/// The broker's counts over `queues`.
pub(super) async fn describe(
    admin: &Admin,
    queues: &[String],
) -> Result<BrokerCounts, ClientError> {
    let mut counts = BrokerCounts::default();
    // Many queues (OMB's 1,000-topic workloads) are described
    // DESCRIBE_CONCURRENCY at a time: one by one, a sample of 1,000 queues
    // took longer than the run under load, and the phase end waited for it.
    let mut described = Vec::with_capacity(queues.len());
    for chunk in queues.chunks(DESCRIBE_CONCURRENCY) {
        // Owned futures (names and a clone of the admin): a future borrowing
        // them would not be `Send` for every lifetime, as the sampler's
        // spawned task needs.
        let asks = chunk.iter().cloned().map(|queue| {
            let admin = admin.clone();
            async move { admin.describe_queue(&queue).await }
        });
        described.extend(futures_util::future::join_all(asks).await);
    }
    for described in described {
        let described = described?;
        // Several subscriptions: the ready, scheduled, claimed and acked
        // counts of each (the default's among them); the partitions' other
        // figures are the default's.
        let subscribed = described.subscriptions.len() > 1;
        for sub in described.subscriptions.iter().filter(|_| subscribed) {
            counts.ready += sub.ready;
            counts.scheduled += sub.scheduled;
            counts.claimed += sub.claimed;
            counts.acked += sub.acked;
            counts.oldest_ready_age_ms = counts.oldest_ready_age_ms.max(sub.oldest_ready_age_ms);
            counts.quarantined += sub.dead_letters;
        }
        for stats in described.partitions {
            if subscribed {
                counts.released += stats.released;
                counts.lease_expired += stats.lease_expired;
                continue;
            }
            counts.ready += stats.ready;
            counts.scheduled += stats.scheduled;
            counts.claimed += stats.claimed;
            counts.acked += stats.acked;
            counts.oldest_ready_age_ms = counts.oldest_ready_age_ms.max(stats.oldest_ready_age_ms);
            counts.released += stats.released;
            counts.lease_expired += stats.lease_expired;
            counts.quarantined += stats.quarantined;
        }
    }
    counts.backlog = counts.ready + counts.scheduled + counts.claimed;
    Ok(counts)
}

/// Everything the controller and the sampler share.
pub(super) struct Live {
    pub(super) recorder: Arc<Recorder>,
    pub(super) workers: tokio::sync::Mutex<Workers>,
    pub(super) admin: Admin,
    pub(super) queues: Vec<String>,
    /// Phase names, for samples.
    pub(super) phase_names: Vec<String>,
    pub(super) phase_slots: Vec<u32>,
    pub(super) progress: ProgressBar,
    /// Subscriptions per queue: each consumes every enqueue once.
    pub(super) subscriptions: u32,
}

/// Client counters at one instant.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Snapshot {
    pub(super) t_ns: u64,
    pub(super) enqueued: u64,
    pub(super) stats: ConsumerStats,
    /// Subscriptions per queue (each enqueue is delivered once in each).
    pub(super) subscriptions: u32,
}

impl Snapshot {
    /// Deliveries owed: every enqueue once per subscription.
    fn owed(&self) -> i64 {
        (self.enqueued as i64).saturating_mul(i64::from(self.subscriptions.max(1)))
    }

    pub(super) fn backlog(&self) -> i64 {
        self.owed() - self.stats.acked as i64
    }

    pub(super) fn ready(&self) -> i64 {
        self.owed() - self.stats.claimed as i64
    }

    pub(super) fn held(&self) -> i64 {
        self.stats.claimed as i64 - self.stats.acked as i64 - self.stats.released as i64
    }
}

impl Live {
    pub(super) async fn snapshot(&self) -> Snapshot {
        let stats = self.workers.lock().await.stats();
        Snapshot {
            t_ns: self.recorder.now_ns(),
            enqueued: self.recorder.enqueued.load(Ordering::Acquire),
            stats,
            subscriptions: self.subscriptions,
        }
    }

    /// Client counts read around one DescribeQueue.
    pub(super) async fn check(&self) -> Result<(BacklogCheck, BrokerCounts), ClientError> {
        let before = self.snapshot().await.backlog();
        let counts = describe(&self.admin, &self.queues).await?;
        let after = self.snapshot().await.backlog();
        let client_estimate = (before + after) as f64 / 2.0;
        let broker = counts.backlog as f64;
        let relative_error = if counts.backlog == 0 && before == 0 && after == 0 {
            0.0
        } else {
            (client_estimate - broker).abs() / broker.max(1.0)
        };
        let check = BacklogCheck {
            client_before: before,
            client_after: after,
            client_estimate,
            broker: counts.backlog,
            relative_error,
        };
        Ok((check, counts))
    }

    /// One sample since `previous`; takes the interval histograms.
    pub(super) async fn sample(
        &self,
        previous: &Snapshot,
    ) -> Result<(Sample, Snapshot), ClientError> {
        let now = self.snapshot().await;
        let counts = describe(&self.admin, &self.queues).await?;
        let (publish, e2e) = {
            let mut histograms = self.recorder.histograms();
            let publish = histograms.publish_interval.summary();
            let e2e = histograms.e2e_interval.summary();
            histograms.publish_interval.reset();
            histograms.e2e_interval.reset();
            (publish, e2e)
        };
        let interval_s = (now.t_ns.saturating_sub(previous.t_ns)) as f64 / 1e9;
        let rate = |now: u64, before: u64| now.saturating_sub(before) as f64 / interval_s.max(1e-9);
        let phase = self.recorder.phase.load(Ordering::Acquire);
        let sample = Sample {
            t_s: now.t_ns as f64 / 1e9,
            phase: self.phase_names.get(phase).cloned().unwrap_or_default(),
            publish_rate: rate(now.enqueued, previous.enqueued),
            consume_rate: rate(now.stats.acked, previous.stats.acked),
            backlog_client: now.backlog(),
            ready_client: now.ready(),
            backlog_broker: counts.backlog,
            ready_broker: counts.ready,
            claimed_broker: counts.claimed,
            oldest_ready_age_ms: counts.oldest_ready_age_ms,
            busy_slots: self.recorder.busy.load(Ordering::Acquire),
            held_slots: now.held(),
            slots: self.phase_slots.get(phase).copied().unwrap_or(0),
            predicted_backlog: None,
            publish_latency_ms: publish.into(),
            e2e_latency_ms: e2e.into(),
            errors: self.recorder.error_count.load(Ordering::Acquire),
        };
        self.progress.set_position(sample.t_s as u64);
        self.progress.set_message(format!(
            "{} in {:.0}/s out {:.0}/s backlog {} p99 {:.1} ms",
            sample.phase,
            sample.publish_rate,
            sample.consume_rate,
            sample.backlog_client,
            sample.publish_latency_ms.p99,
        ));
        Ok((sample, now))
    }
}

/// Samples every second until told to stop.
pub(super) async fn sampler(
    live: Arc<Live>,
    stop: Arc<AtomicBool>,
) -> Result<Vec<Sample>, ClientError> {
    let mut samples = Vec::new();
    let mut previous = live.snapshot().await;
    let mut ticks = tokio::time::interval(Duration::from_secs(1));
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticks.tick().await;
    while !stop.load(Ordering::Acquire) && samples.len() < SAMPLES_MAX {
        ticks.tick().await;
        let (sample, now) = live.sample(&previous).await?;
        samples.push(sample);
        previous = now;
    }
    Ok(samples)
}

pub(super) fn progress_bar(config: &LoadConfig) -> ProgressBar {
    if !config.progress || !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::with_draw_target(
        Some(config.expected_s.ceil().max(1.0) as u64),
        ProgressDrawTarget::stderr(),
    );
    if let Ok(style) =
        ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} s  {msg}")
    {
        bar.set_style(style.progress_chars("=> "));
    }
    bar
}
