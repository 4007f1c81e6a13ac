//! The counters and histograms of one run, shared by the pacers, the
//! collectors, the workers' handlers and the sampler; and the correction
//! that holds a handler's service time to its mean (module doc of
//! [`crate::load`]).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use rand_chacha::ChaCha8Rng;
use spool_broker::clock::{instant_now, Instant};
use spool_client::Delivery;

use super::LoadError;
use crate::dist::{self, ServiceTime};
use crate::harness::error_name;
use crate::histogram::Latency;
use crate::sends::{self, Sent};

/// Weight of one observation in the running mean of timer lateness.
const OVERSHOOT_EWMA_SHIFT: u32 = 6;

/// Counters and histograms shared by pacers, collectors, handlers and the
/// sampler.
pub(super) struct Recorder {
    pub(super) base: Instant,
    pub(super) stopping: AtomicBool,
    /// Index into the phases: the pacers' current rate.
    pub(super) phase: AtomicUsize,
    pub(super) submitted: AtomicU64,
    pub(super) enqueued: AtomicU64,
    pub(super) redelivered: AtomicU64,
    pub(super) busy: AtomicU64,
    /// Running mean of how late a handler's sleep ends (ns).
    pub(super) overshoot_ns: AtomicU64,
    pub(super) error_count: AtomicU64,
    pub(super) histograms: Mutex<Histograms>,
    pub(super) errors: Mutex<BTreeMap<String, u64>>,
    pub(super) service_rng: Mutex<ChaCha8Rng>,
}

pub(super) struct Histograms {
    pub(super) publish_interval: Latency,
    pub(super) e2e_interval: Latency,
    pub(super) publish: Latency,
    pub(super) e2e: Latency,
    pub(super) service: Latency,
}

impl Recorder {
    /// Counting from now; the handlers' service times drawn from `seed`'s
    /// stream 0.
    pub(super) fn new(seed: u64) -> Result<Self, LoadError> {
        let histogram = || Latency::new().map_err(|error| LoadError::Histogram(error.to_string()));
        Ok(Self {
            base: instant_now(),
            stopping: AtomicBool::new(false),
            phase: AtomicUsize::new(0),
            submitted: AtomicU64::new(0),
            enqueued: AtomicU64::new(0),
            redelivered: AtomicU64::new(0),
            busy: AtomicU64::new(0),
            overshoot_ns: AtomicU64::new(0),
            error_count: AtomicU64::new(0),
            histograms: Mutex::new(Histograms {
                publish_interval: histogram()?,
                e2e_interval: histogram()?,
                publish: histogram()?,
                e2e: histogram()?,
                service: histogram()?,
            }),
            errors: Mutex::new(BTreeMap::new()),
            service_rng: Mutex::new(dist::rng(seed, 0)),
        })
    }

    pub(super) fn now_ns(&self) -> u64 {
        u64::try_from(instant_now().duration_since(self.base).as_nanos()).unwrap_or(u64::MAX)
    }

    pub(super) fn stopping(&self) -> bool {
        self.stopping.load(Ordering::Acquire)
    }

    pub(super) fn histograms(&self) -> MutexGuard<'_, Histograms> {
        self.histograms.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(super) fn count_error(&self, name: String) {
        self.error_count.fetch_add(1, Ordering::Relaxed);
        *self.errors.lock().unwrap_or_else(PoisonError::into_inner).entry(name).or_insert(0) += 1;
    }

    pub(super) fn sent(&self, (due_ns, result): Sent) {
        match result {
            Ok(_) => {
                let latency_ns = self.now_ns().saturating_sub(due_ns);
                self.enqueued.fetch_add(1, Ordering::AcqRel);
                let mut histograms = self.histograms();
                histograms.publish_interval.record_ns(latency_ns);
                histograms.publish.record_ns(latency_ns);
            }
            Err(error) => self.count_error(format!("enqueue.{}", error_name(&error))),
        }
    }

    pub(super) fn delivered(&self, delivery: &Delivery) {
        if delivery.attempt() > 1 {
            self.redelivered.fetch_add(1, Ordering::Relaxed);
        }
        match sends::sent_ns(delivery) {
            Some(sent_ns) => {
                let latency_ns = self.now_ns().saturating_sub(sent_ns);
                let mut histograms = self.histograms();
                histograms.e2e_interval.record_ns(latency_ns);
                histograms.e2e.record_ns(latency_ns);
            }
            None => self.count_error("e2e.bad_payload".to_owned()),
        }
    }

    pub(super) fn service_ns(&self, service: &ServiceTime) -> u64 {
        service.sample_ns(&mut self.service_rng.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// How long to sleep for a service time of `service_ns`: shortened by
    /// the mean lateness so far (module doc).
    pub(super) fn sleep_for_ns(&self, service_ns: u64) -> u64 {
        service_ns.saturating_sub(self.overshoot_ns.load(Ordering::Relaxed))
    }

    /// Folds one sleep's lateness into the running mean (a lost update
    /// between racing handlers only drops one observation).
    pub(super) fn observe_overshoot(&self, asked_ns: u64, slept_ns: u64) {
        let late = i128::from(slept_ns) - i128::from(asked_ns);
        let mean = i128::from(self.overshoot_ns.load(Ordering::Relaxed));
        let next = mean + ((late - mean) >> OVERSHOOT_EWMA_SHIFT);
        self.overshoot_ns.store(u64::try_from(next.max(0)).unwrap_or(0), Ordering::Relaxed);
    }
}
