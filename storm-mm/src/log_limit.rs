//! Rate limits for errors that recur every heartbeat: the first is logged at once, repeats at
//! most once per interval with the number suppressed in between, so a problem that lasts does
//! not write a thousand lines a second.

use std::time::{Duration, Instant};

#[derive(Debug)]
pub struct LogLimit {
    interval: Duration,
    last: Option<Instant>,
    suppressed: u64,
}

impl LogLimit {
    pub fn new(interval: Duration) -> Self {
        Self {
            interval,
            last: None,
            suppressed: 0,
        }
    }

    /// Whether to log this occurrence now; if so, how many were suppressed since the last one.
    pub fn allow(&mut self, now: Instant) -> Option<u64> {
        match self.last {
            Some(last) if now.duration_since(last) < self.interval => {
                self.suppressed += 1;
                None
            }
            _ => {
                self.last = Some(now);
                Some(std::mem::take(&mut self.suppressed))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repeats_within_the_interval_are_counted_not_logged() {
        let mut limit = LogLimit::new(Duration::from_secs(1));
        let t0 = Instant::now();
        assert_eq!(limit.allow(t0), Some(0));
        for i in 1..=999 {
            assert_eq!(limit.allow(t0 + Duration::from_micros(i * 1000)), None);
        }
        assert_eq!(limit.allow(t0 + Duration::from_secs(1)), Some(999));
        assert_eq!(limit.allow(t0 + Duration::from_millis(1500)), None);
        assert_eq!(limit.allow(t0 + Duration::from_secs(3)), Some(1));
    }
}
