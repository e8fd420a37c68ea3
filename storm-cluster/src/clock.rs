//! The time the daemons' logic reads.
//!
//! The machine manager's and node managers' rules are stated in time (K missed heartbeats,
//! `kill_wait_ms`, a job's time limit, the reattach grace after a restart). Their logic reads
//! time only from a [`Clock`]: the daemons run on [`SystemClock`]; the simulator runs them on
//! a [`VirtualClock`] that moves only when it is told to, so a test can say "the node is DOWN
//! at exactly the K-th missed heartbeat" instead of "within ten seconds".
//!
//! A clock gives both the monotonic time decisions are made with and the wall-clock time
//! records keep (the journal's milliseconds since the Unix epoch).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Milliseconds since the Unix epoch as this host's local time, `2026-11-27T07:01:22` (as
/// sacct shows times); the number itself if the host cannot say.
pub fn format_unix_ms(ms: u64) -> String {
    let secs = (ms / 1000) as libc::time_t;
    // SAFETY: localtime_r writes only into `tm`, which it is given.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    if unsafe { libc::localtime_r(&secs, &mut tm) }.is_null() {
        return ms.to_string();
    }
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}",
        tm.tm_year + 1900,
        tm.tm_mon + 1,
        tm.tm_mday,
        tm.tm_hour,
        tm.tm_min,
        tm.tm_sec
    )
}

/// Where the daemons' logic reads the time.
pub trait Clock: Send + Sync {
    /// The monotonic time now.
    fn now(&self) -> Instant;
    /// The wall-clock time now, in milliseconds since the Unix epoch.
    fn unix_ms(&self) -> u64;
}

/// The operating system's clocks.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Instant {
        Instant::now()
    }

    fn unix_ms(&self) -> u64 {
        crate::daemon::unix_ms()
    }
}

/// A clock that stands still until [`VirtualClock::advance`] moves it. Its monotonic time
/// starts at the real `Instant` it was made at; its wall-clock time at a fixed, arbitrary
/// date, so that records made in a simulation are the same on every run.
#[derive(Debug)]
pub struct VirtualClock {
    origin: Instant,
    elapsed_ns: AtomicU64,
}

/// The wall-clock time a [`VirtualClock`] starts at: 2026-01-01T00:00:00Z.
pub const VIRTUAL_UNIX_START_MS: u64 = 1_767_225_600_000;

impl VirtualClock {
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            origin: Instant::now(),
            elapsed_ns: AtomicU64::new(0),
        })
    }

    /// Moves the clock forward by `d`.
    pub fn advance(&self, d: Duration) {
        self.elapsed_ns
            .fetch_add(d.as_nanos() as u64, Ordering::SeqCst);
    }

    /// Moves the clock forward to `t`; a `t` in the past leaves it where it is.
    pub fn advance_to(&self, t: Instant) {
        let target = t.saturating_duration_since(self.origin).as_nanos() as u64;
        self.elapsed_ns.fetch_max(target, Ordering::SeqCst);
    }

    /// How far the clock has moved since it was made.
    pub fn elapsed(&self) -> Duration {
        Duration::from_nanos(self.elapsed_ns.load(Ordering::SeqCst))
    }
}

impl Clock for VirtualClock {
    fn now(&self) -> Instant {
        self.origin + self.elapsed()
    }

    fn unix_ms(&self) -> u64 {
        VIRTUAL_UNIX_START_MS + self.elapsed().as_millis() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_virtual_clock_moves_only_when_told_and_never_back() {
        let c = VirtualClock::new();
        let t0 = c.now();
        std::thread::sleep(Duration::from_millis(2));
        assert_eq!(c.now(), t0, "real time passing must not move it");
        c.advance(Duration::from_millis(250));
        assert_eq!(c.now() - t0, Duration::from_millis(250));
        assert_eq!(c.unix_ms(), VIRTUAL_UNIX_START_MS + 250);
        c.advance_to(t0 + Duration::from_millis(100));
        assert_eq!(
            c.now() - t0,
            Duration::from_millis(250),
            "advance_to never goes back"
        );
        c.advance_to(t0 + Duration::from_secs(1));
        assert_eq!(c.elapsed(), Duration::from_secs(1));
    }
}
