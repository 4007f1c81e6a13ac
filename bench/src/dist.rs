//! The random draws of the load generator: log-normal service times and
//! exponential inter-arrival gaps (a Poisson arrival process), from a seeded
//! ChaCha generator so a run's schedule repeats for a given `--seed`.
//!
//! Pure: no clock, no I/O. It does not decide when anything happens; the
//! pacers and workers in [`crate::load`] do, from these draws. The
//! distributions are `rand_distr`'s; the tests below check their moments.

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Exp1, LogNormal};
use serde::Serialize;

/// Largest coefficient of variation accepted for a service time: beyond it
/// a log-normal's mean is carried by draws too rare to show in a run.
pub const SERVICE_CV_MAX: f64 = 10.0;
/// Longest mean service time (ms).
pub const SERVICE_MS_MAX: f64 = 600_000.0;

/// A log-normal service time with a given mean and coefficient of variation
/// (stddev / mean); mean 0 means "no work" (the handler returns at once).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct ServiceTime {
    pub mean_ms: f64,
    pub cv: f64,
}

impl ServiceTime {
    /// One draw, in nanoseconds. A mean of 0 (or one the distribution
    /// cannot take: negative, NaN, a negative or non-finite CV; the CLI
    /// refuses those first) draws 0 and uses no randomness.
    pub fn sample_ns(&self, rng: &mut ChaCha8Rng) -> u64 {
        if self.mean_ms <= 0.0 {
            return 0;
        }
        let Ok(log_normal) = LogNormal::from_mean_cv(self.mean_ms, self.cv) else {
            return 0;
        };
        let ms = log_normal.sample(rng);
        // Saturating float-to-int cast: a draw past u64 ns (584 years) is
        // clamped, never UB.
        (ms * 1e6).min(SERVICE_MS_MAX * 1e6 * 100.0) as u64
    }
}

/// How sends are spaced in time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Arrivals {
    /// Exactly 1/rate apart.
    Fixed,
    /// Exponential gaps of mean 1/rate: a Poisson process.
    Poisson,
}

impl Arrivals {
    /// The gap before the next send at `rate_per_s` (> 0), in ns.
    pub fn gap_ns(self, rate_per_s: f64, rng: &mut ChaCha8Rng) -> u64 {
        let mean_ns = 1e9 / rate_per_s;
        let gap = match self {
            Self::Fixed => mean_ns,
            Self::Poisson => {
                let unit: f64 = Exp1.sample(rng);
                mean_ns * unit
            }
        };
        // Saturating cast; at least 1 ns so the schedule always advances.
        (gap as u64).max(1)
    }
}

/// The generator for stream `stream` of a run seeded with `seed`: each
/// pacer and the workers get their own, so adding one does not shift the
/// others' draws.
pub fn rng(seed: u64, stream: u64) -> ChaCha8Rng {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream(stream);
    rng
}

#[cfg(test)]
mod tests {
    use super::*;

    fn moments(samples: &[f64]) -> (f64, f64) {
        let n = samples.len() as f64;
        let mean = samples.iter().sum::<f64>() / n;
        let var = samples.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / n;
        (mean, var.sqrt() / mean)
    }

    #[test]
    fn log_normal_has_the_asked_mean_and_cv() {
        // Goal: the service-time draw matches the mean and CV the model asks for;
        // method: 200 k draws at 18 ms / CV 0.5 and 18 ms / CV 1, sample moments within 3 %.
        for cv in [0.5, 1.0] {
            let service = ServiceTime { mean_ms: 18.0, cv };
            let mut rng = rng(7, 1);
            let samples: Vec<f64> =
                (0..200_000).map(|_| service.sample_ns(&mut rng) as f64 / 1e6).collect();
            let (mean, sample_cv) = moments(&samples);
            assert!((mean - 18.0).abs() / 18.0 < 0.03, "cv {cv}: mean {mean}");
            assert!((sample_cv - cv).abs() / cv < 0.05, "cv {cv}: sample cv {sample_cv}");
        }
        let none = ServiceTime { mean_ms: 0.0, cv: 1.0 };
        assert_eq!(none.sample_ns(&mut rng(1, 1)), 0);
        let constant = ServiceTime { mean_ms: 18.0, cv: 0.0 };
        let exact = constant.sample_ns(&mut rng(1, 1)).abs_diff(18_000_000);
        assert!(exact <= 1, "cv 0 draws the mean: off by {exact} ns");
    }

    #[test]
    fn poisson_gaps_average_one_over_rate_and_fixed_gaps_are_exact() {
        // Goal: both arrival processes keep the asked rate; Poisson gaps vary like an
        // exponential (CV ≈ 1). Method: 200 k gaps at 25,000/s.
        let mut rng = rng(3, 2);
        assert_eq!(Arrivals::Fixed.gap_ns(25_000.0, &mut rng), 40_000);
        let gaps: Vec<f64> =
            (0..200_000).map(|_| Arrivals::Poisson.gap_ns(25_000.0, &mut rng) as f64).collect();
        let (mean, cv) = moments(&gaps);
        assert!((mean - 40_000.0).abs() / 40_000.0 < 0.01, "mean gap {mean}");
        assert!((cv - 1.0).abs() < 0.02, "exponential gaps have CV 1: {cv}");
    }

    #[test]
    fn streams_of_one_seed_differ_and_repeat() {
        // Goal: a seed reproduces a schedule, and two pacers do not share draws.
        let draw = |stream| Arrivals::Poisson.gap_ns(1000.0, &mut rng(5, stream));
        assert_eq!(draw(1), draw(1));
        assert_ne!(draw(1), draw(2));
        let service = ServiceTime { mean_ms: 18.0, cv: 1.0 };
        let draws = |stream| -> Vec<u64> {
            let mut rng = rng(5, stream);
            (0..8).map(|_| service.sample_ns(&mut rng)).collect()
        };
        assert_eq!(draws(3), draws(3));
        assert_ne!(draws(3), draws(4));
    }
}
