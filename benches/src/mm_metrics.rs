//! Reading the MM's metrics (`storm metrics`, the Prometheus text format) from a benchmark:
//! a histogram's count and sum before and after a measurement give the mean of what it
//! observed meanwhile.

use std::path::Path;

use anyhow::Result;

/// The MM's metrics as it answered them once.
pub struct MmMetrics(String);

impl MmMetrics {
    /// Asks the MM at control socket `socket`.
    pub fn fetch(socket: &Path) -> Result<Self> {
        Ok(Self(
            storm_cli::metrics_http::fetch(socket).map_err(anyhow::Error::msg)?,
        ))
    }

    /// The value of the series named exactly `name` (no labels), 0 if there is none.
    pub fn value(&self, name: &str) -> f64 {
        self.0
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
            .unwrap_or(0.0)
    }

    /// Histogram `name`'s count and sum.
    pub fn histogram(&self, name: &str) -> CountSum {
        CountSum(
            self.value(&format!("{name}_count")) as u64,
            self.value(&format!("{name}_sum")),
        )
    }
}

/// A histogram's count and sum (seconds).
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct CountSum(pub u64, pub f64);

impl CountSum {
    /// The mean of what was observed; NaN if nothing was.
    pub fn mean(&self) -> f64 {
        if self.0 == 0 {
            f64::NAN
        } else {
            self.1 / self.0 as f64
        }
    }

    /// What was observed after `earlier`.
    pub fn since(&self, earlier: CountSum) -> CountSum {
        CountSum(self.0.saturating_sub(earlier.0), self.1 - earlier.1)
    }
}
