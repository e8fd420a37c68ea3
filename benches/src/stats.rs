//! Repeated timing: run a closure until enough samples or enough time, report the median.

use std::time::{Duration, Instant};

/// How long to keep sampling one measurement.
#[derive(Debug, Clone, Copy)]
pub struct Budget {
    pub min_samples: usize,
    pub max_samples: usize,
    pub time: Duration,
}

impl Default for Budget {
    fn default() -> Self {
        Self {
            min_samples: 5,
            max_samples: 2000,
            time: Duration::from_millis(300),
        }
    }
}

/// Samples of one measurement, in seconds.
#[derive(Debug, Clone)]
pub struct Samples(Vec<f64>);

impl Samples {
    /// Samples measured elsewhere, in seconds.
    pub fn from_secs(v: Vec<f64>) -> Self {
        Self(v)
    }

    pub fn median(&self) -> f64 {
        self.quantile(0.5)
    }

    pub fn quantile(&self, q: f64) -> f64 {
        let mut v = self.0.clone();
        v.sort_by(|a, b| a.total_cmp(b));
        if v.is_empty() {
            return f64::NAN;
        }
        let idx = ((v.len() - 1) as f64 * q).round() as usize;
        v[idx]
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// The samples, in seconds, in the order taken.
    pub fn values(&self) -> &[f64] {
        &self.0
    }
}

/// Times `f` repeatedly within `budget`. `f` returns the duration it measured itself (so it
/// can exclude set-up), or an error that stops the measurement.
pub fn sample<E>(budget: Budget, mut f: impl FnMut() -> Result<Duration, E>) -> Result<Samples, E> {
    let start = Instant::now();
    let mut out = Vec::new();
    // One warm-up run, not recorded.
    f()?;
    while out.len() < budget.max_samples
        && (out.len() < budget.min_samples || start.elapsed() < budget.time)
    {
        out.push(f()?.as_secs_f64());
    }
    Ok(Samples(out))
}

/// Seconds as a human unit.
pub fn fmt_time(secs: f64) -> String {
    if secs < 1e-6 {
        format!("{:.0} ns", secs * 1e9)
    } else if secs < 1e-3 {
        format!("{:.1} us", secs * 1e6)
    } else if secs < 1.0 {
        format!("{:.2} ms", secs * 1e3)
    } else {
        format!("{secs:.3} s")
    }
}

/// Bytes per second as MB/s (10^6).
pub fn mb_per_s(bytes: usize, secs: f64) -> f64 {
    bytes as f64 / secs / 1e6
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_and_quantiles_of_known_samples() {
        let s = Samples(vec![5.0, 1.0, 3.0, 2.0, 4.0]);
        assert_eq!(s.median(), 3.0);
        assert_eq!(s.quantile(0.0), 1.0);
        assert_eq!(s.quantile(1.0), 5.0);
    }

    #[test]
    fn sampling_respects_the_minimum_and_stops_on_error() {
        let mut calls = 0;
        let s = sample::<()>(
            Budget {
                min_samples: 7,
                max_samples: 7,
                time: Duration::ZERO,
            },
            || {
                calls += 1;
                Ok(Duration::from_micros(calls))
            },
        )
        .unwrap();
        assert_eq!(s.len(), 7);
        assert_eq!(calls, 8, "one warm-up run");
        let failed = sample(Budget::default(), || Err::<Duration, _>("boom"));
        assert_eq!(failed.unwrap_err(), "boom");
    }

    #[test]
    fn units_are_readable() {
        assert_eq!(fmt_time(12e-6), "12.0 us");
        assert_eq!(fmt_time(42e-9), "42 ns");
        assert_eq!(fmt_time(0.0123), "12.30 ms");
        assert_eq!(fmt_time(2.5), "2.500 s");
        assert_eq!(mb_per_s(2_000_000, 1.0), 2.0);
    }
}
