//! Whether a task has really stopped: its state in /proc/PID/stat.
//!
//! Gang scheduling checks this at every switch for every task it stops, so each task's stat
//! file is opened once and then read with one pread(2) per look, instead of open, stat, several
//! reads and close.
//!
//! Between looks the NM sleeps: a task acts on SIGSTOP only once it has a CPU, often the one
//! the NM holds. Every sleep is a wake-up, and wake-ups are most of what a switch costs the
//! NM, so the first sleep lasts about as long as stops have lately taken (see
//! [`next_first_pause`]): one look after one sleep usually finds the tasks stopped.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::time::{Duration, Instant};

/// Shortest and longest sleep before the first look after a SIGSTOP.
const FIRST_PAUSE_MIN: Duration = Duration::from_micros(10);
const FIRST_PAUSE_MAX: Duration = Duration::from_micros(500);
/// Sleep before each later look (doubling up to `LATER_PAUSE_MAX`).
const LATER_PAUSE: Duration = Duration::from_micros(10);
const LATER_PAUSE_MAX: Duration = Duration::from_micros(500);

pub struct TaskStates {
    files: HashMap<i32, File>,
    /// How long to sleep before the first look: tuned by every wait.
    first_pause: Duration,
}

impl Default for TaskStates {
    fn default() -> Self {
        Self {
            files: HashMap::new(),
            first_pause: FIRST_PAUSE_MIN,
        }
    }
}

/// The first pause of the next wait, after one that slept `sleeps` times with `pause` as its
/// first pause. A wait that needed no more than one sleep shortens it a little, one that needed
/// more lengthens it by half: it settles where about one wait in ten needs a second look, so
/// a switch costs the NM one wake-up and ends about as soon as the tasks have stopped.
pub fn next_first_pause(pause: Duration, sleeps: u32) -> Duration {
    let next = if sleeps <= 1 {
        pause.mul_f64(0.95)
    } else {
        pause.mul_f64(1.5)
    };
    next.clamp(FIRST_PAUSE_MIN, FIRST_PAUSE_MAX)
}

/// The state letter of a /proc/PID/stat line: the field after the command name, which is in
/// parentheses and may itself contain ") ", hence the last one.
fn state_of(stat: &[u8]) -> Option<char> {
    let text = std::str::from_utf8(stat).ok()?;
    let (_, rest) = text.rsplit_once(") ")?;
    rest.chars().next()
}

impl TaskStates {
    /// The task's state (`R`, `S`, `D`, `T`, `Z`...), or `None` if it is gone.
    pub fn state(&mut self, pid: i32) -> Option<char> {
        let file = match self.files.entry(pid) {
            Entry::Occupied(e) => e.into_mut(),
            Entry::Vacant(e) => e.insert(File::open(format!("/proc/{pid}/stat")).ok()?),
        };
        // The state comes within the first ~30 bytes (pid, a command name of at most 15
        // bytes, the state); the numbers after it contain no ')'.
        let mut buf = [0u8; 128];
        match file.read_at(&mut buf, 0) {
            Ok(n) if n > 0 => state_of(&buf[..n]),
            _ => {
                self.files.remove(&pid);
                None
            }
        }
    }

    /// Closes the stat file of a task that is done with.
    pub fn forget(&mut self, pid: i32) {
        self.files.remove(&pid);
    }

    /// Waits until none of `pids` is runnable (R), sleeping (S) or in disk wait (D), that is
    /// until each has acted on its SIGSTOP or is gone; false if `limit` passed first.
    pub fn wait_until_stopped(&mut self, pids: &[i32], limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        // A task acts on SIGSTOP only once it gets a CPU, so leave the CPU to it: sleep between
        // looks rather than poll at full speed (or yield, which a busy NM would return from at
        // once). The first sleep is as long as stops lately took; the later ones start short
        // and double.
        let mut pause = self.first_pause;
        let mut sleeps = 0;
        for &pid in pids {
            while matches!(self.state(pid), Some('R' | 'S' | 'D')) {
                if Instant::now() >= deadline {
                    return false;
                }
                std::thread::sleep(pause);
                sleeps += 1;
                pause = match sleeps {
                    1 => LATER_PAUSE,
                    _ => (pause * 2).min(LATER_PAUSE_MAX),
                };
            }
        }
        if !pids.is_empty() {
            self.first_pause = next_first_pause(self.first_pause, sleeps);
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;

    #[test]
    fn the_state_is_read_after_the_last_parenthesis() {
        assert_eq!(state_of(b"42 (sleep) S 1 42 42 0"), Some('S'));
        assert_eq!(state_of(b"42 (a) b) T 1 42"), Some('T'));
        assert_eq!(state_of(b"garbage"), None);
    }

    #[test]
    fn the_first_pause_follows_how_many_looks_stops_needed() {
        let pause = Duration::from_micros(100);
        // Stopped at the first look (or before any sleep): try a little shorter next time.
        assert!(next_first_pause(pause, 0) < pause);
        assert!(next_first_pause(pause, 1) < pause);
        // It needed a second look: sleep longer first next time.
        assert!(next_first_pause(pause, 2) > pause);
        // A run of stops that each need two looks lengthens it faster than a run of quick ones
        // shortens it, so it settles where most stops need one look.
        let (mut up, mut down) = (pause, pause);
        for _ in 0..3 {
            up = next_first_pause(up, 2);
            down = next_first_pause(down, 1);
        }
        assert!(up - pause > pause - down);
        // Bounded both ways, so one stuck task cannot make every switch sleep long, nor a
        // run of quick stops make the NM spin.
        let mut p = pause;
        for _ in 0..100 {
            p = next_first_pause(p, 5);
        }
        assert_eq!(p, FIRST_PAUSE_MAX);
        for _ in 0..1000 {
            p = next_first_pause(p, 0);
        }
        assert_eq!(p, FIRST_PAUSE_MIN);
    }

    #[test]
    fn a_stopped_child_is_seen_stopped_and_a_reaped_one_gone() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = child.id() as i32;
        let mut states = TaskStates::default();
        // Running, sleeping, or in disk wait while it execs.
        assert!(matches!(states.state(pid), Some('R' | 'S' | 'D')));
        kill(Pid::from_raw(pid), Signal::SIGSTOP).unwrap();
        assert!(states.wait_until_stopped(&[pid], Duration::from_secs(5)));
        assert_eq!(states.state(pid), Some('T'));
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(states.state(pid), None);
        assert!(states.files.is_empty(), "the file of a gone task is closed");
    }
}
