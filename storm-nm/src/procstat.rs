//! Whether a task has really stopped: its state in /proc/PID/stat.
//!
//! Gang scheduling checks this at every switch for every task it stops, so each task's stat
//! file is opened once and then read with one pread(2) per look, instead of open, stat, several
//! reads and close.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::time::{Duration, Instant};

#[derive(Default)]
pub struct TaskStates {
    files: HashMap<i32, File>,
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
        // looks, longer and longer, rather than poll at full speed (or yield, which a busy
        // NM would return from at once).
        let mut pause = Duration::from_micros(10);
        for &pid in pids {
            while matches!(self.state(pid), Some('R' | 'S' | 'D')) {
                if Instant::now() >= deadline {
                    return false;
                }
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_micros(500));
            }
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
