//! Rate limits for errors that recur every heartbeat: the first is logged at once, repeats at
//! most once per interval with the number suppressed in between, so a problem that lasts does
//! not write a thousand lines a second. The same serves warnings a peer or user can provoke
//! at will (refused handshakes, refused connections): they cost a line per interval, not a
//! line per attempt.

use std::time::{Duration, Instant};

#[derive(Debug)]
pub struct LogLimit {
    interval: Duration,
    /// Lines allowed per interval.
    burst: u32,
    /// When the current interval began, and the lines logged in it.
    since: Option<Instant>,
    logged: u32,
    suppressed: u64,
}

impl LogLimit {
    /// One line per `interval`.
    pub fn new(interval: Duration) -> Self {
        Self::with_burst(interval, 1)
    }

    /// Up to `burst` lines per `interval` (each occurrence still logged while it is rare).
    pub fn with_burst(interval: Duration, burst: u32) -> Self {
        Self {
            interval,
            burst: burst.max(1),
            since: None,
            logged: 0,
            suppressed: 0,
        }
    }

    /// Whether to log this occurrence now; if so, how many were suppressed since the last one.
    pub fn allow(&mut self, now: Instant) -> Option<u64> {
        match self.since {
            Some(since) if now.duration_since(since) < self.interval => {
                if self.logged < self.burst {
                    self.logged += 1;
                    Some(std::mem::take(&mut self.suppressed))
                } else {
                    self.suppressed += 1;
                    None
                }
            }
            _ => {
                self.since = Some(now);
                self.logged = 1;
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

    #[test]
    fn a_burst_is_logged_whole_then_counted() {
        let mut limit = LogLimit::with_burst(Duration::from_secs(10), 3);
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        assert_eq!(limit.allow(at(0)), Some(0));
        assert_eq!(limit.allow(at(1)), Some(0));
        assert_eq!(limit.allow(at(2)), Some(0));
        for i in 3..100 {
            assert_eq!(limit.allow(at(i)), None);
        }
        assert_eq!(limit.allow(at(10_000)), Some(97));
    }
}
