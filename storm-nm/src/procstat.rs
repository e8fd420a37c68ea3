//! Whether a task has really stopped: its state in /proc/PID/stat.
//!
//! Gang scheduling checks this at every switch for every task it stops, so each task's stat
//! file is opened once and then read with one pread(2) per look, instead of open, stat, several
//! reads and close.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::fs::File;
use std::os::unix::fs::FileExt;

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

    /// Whether none of `pids` is runnable (R), sleeping (S) or in disk wait (D), that is
    /// whether each has acted on its SIGSTOP or is gone. One read per task, no waiting: a
    /// task acts on SIGSTOP only once it gets a CPU, which the caller leaves to it by sleeping
    /// between looks (spinning here measured worse: the task often waits for this very CPU).
    pub fn all_stopped(&mut self, pids: &[i32]) -> bool {
        pids.iter()
            .all(|&pid| !matches!(self.state(pid), Some('R' | 'S' | 'D')))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;
    use std::time::{Duration, Instant};

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
        let start = Instant::now();
        while !states.all_stopped(&[pid]) {
            assert!(
                start.elapsed() < Duration::from_secs(5),
                "never seen stopped"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(states.state(pid), Some('T'));
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(states.state(pid), None);
        assert!(states.files.is_empty(), "the file of a gone task is closed");
    }
}
