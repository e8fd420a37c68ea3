//! Whether a stopped task can still run its own code: its state and thread count in
//! /proc/PID/stat.
//!
//! Gang scheduling stops the old slot's tasks before it continues the new slot's, so that a
//! node never runs two slots at once. A SIGSTOP is pending in its target as soon as kill(2)
//! returns, and a single-threaded process acts on a pending signal before it runs another
//! instruction of its own (the kernel takes signals on every return to user mode, and a
//! running target is interrupted at once). So a single-threaded task needs no confirmation:
//! it may still show as runnable for the moment it takes to get a CPU and stop, but it runs
//! no more of its code. A multi-threaded one does: the kernel wakes one of its threads to
//! take the signal, and the others run on until that thread has, which on a busy node can
//! take a while. Only those tasks are waited for, until their state is `T`. What is looked
//! at is the task's own process, the leader of its process group; other processes of the
//! group (a shell's children) were sent the same SIGSTOP and are not looked at.
//!
//! Each task's stat file is opened once and then read with one pread(2) per look, instead of
//! open, stat, several reads and close. Between looks the NM sleeps: the thread that takes
//! the signal must get a CPU, often the one the NM holds. Every sleep is a wake-up, and
//! wake-ups are most of what a switch costs the NM, so the first sleep lasts about as long as
//! stops have lately taken (see [`next_first_pause`]): one look after one sleep usually finds
//! the tasks stopped.

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
    /// Sleeps taken waiting for stops, over this value's life.
    sleeps: u64,
}

impl Default for TaskStates {
    fn default() -> Self {
        Self {
            files: HashMap::new(),
            first_pause: FIRST_PAUSE_MIN,
            sleeps: 0,
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

/// What one look at a task's /proc/PID/stat tells.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Look {
    /// `R`, `S`, `D`, `T`, `Z`...
    pub state: char,
    /// Threads in the task's process.
    pub threads: u32,
}

impl Look {
    /// The task runs none of its own code before it stops: it has stopped (or ended), or it
    /// is single-threaded and its SIGSTOP is pending (the caller sent it).
    pub fn cannot_run(self) -> bool {
        !matches!(self.state, 'R' | 'S' | 'D') || self.threads <= 1
    }
}

/// State and thread count from a /proc/PID/stat line. The command name is in parentheses
/// and may itself contain ") ", hence the last one; after it come the state (field 3) and,
/// 17 fields on, the number of threads (field 20).
fn look_at(stat: &[u8]) -> Option<Look> {
    let text = std::str::from_utf8(stat).ok()?;
    let (_, rest) = text.rsplit_once(") ")?;
    let mut fields = rest.split_ascii_whitespace();
    let state = fields.next()?.chars().next()?;
    let threads = fields.nth(16)?.parse().ok()?;
    Some(Look { state, threads })
}

impl TaskStates {
    /// The task's state and thread count, or `None` if it is gone.
    pub fn look(&mut self, pid: i32) -> Option<Look> {
        let file = match self.files.entry(pid) {
            Entry::Occupied(e) => e.into_mut(),
            Entry::Vacant(e) => e.insert(File::open(format!("/proc/{pid}/stat")).ok()?),
        };
        // Field 20 comes within the first ~250 bytes: a command name of at most 15 bytes and
        // 19 numbers of at most 20 digits each.
        let mut buf = [0u8; 512];
        match file.read_at(&mut buf, 0) {
            Ok(n) if n > 0 => look_at(&buf[..n]),
            _ => {
                self.files.remove(&pid);
                None
            }
        }
    }

    /// Sleeps taken so far waiting for stops: each one a wake-up of the NM.
    pub fn sleeps(&self) -> u64 {
        self.sleeps
    }

    /// Closes the stat file of a task that is done with.
    pub fn forget(&mut self, pid: i32) {
        self.files.remove(&pid);
    }

    /// Waits until none of `pids`, each sent SIGSTOP, can run its own code again: each has
    /// stopped, is gone, or is single-threaded (see the module's overview); false if `limit`
    /// passed first. A multi-threaded task is waited for until its state is `T`.
    pub fn wait_until_stopped(&mut self, pids: &[i32], limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        // A task acts on SIGSTOP only once it gets a CPU, so leave the CPU to it: sleep between
        // looks rather than poll at full speed (or yield, which a busy NM would return from at
        // once). The first sleep is as long as stops lately took; the later ones start short
        // and double.
        let mut pause = self.first_pause;
        let mut sleeps = 0;
        // Whether a multi-threaded task was looked at: only waits for those say how long
        // stops take, and tune the first pause.
        let mut confirmed = false;
        for &pid in pids {
            while let Some(look) = self.look(pid) {
                confirmed |= look.threads > 1;
                if look.cannot_run() {
                    break;
                }
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
        self.sleeps += u64::from(sleeps);
        if confirmed {
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

    /// A /proc/PID/stat line with `state` and `threads` in their fields.
    fn stat_line(name: &str, state: char, threads: u32) -> String {
        format!("42 ({name}) {state} 1 42 42 0 -1 4194560 120 0 0 0 5 3 0 0 20 0 {threads} 0 9876")
    }

    #[test]
    fn the_state_and_threads_are_read_after_the_last_parenthesis() {
        let look = |line: String| look_at(line.as_bytes());
        assert_eq!(
            look(stat_line("sleep", 'S', 1)),
            Some(Look {
                state: 'S',
                threads: 1
            })
        );
        assert_eq!(
            look(stat_line("a) b", 'T', 7)),
            Some(Look {
                state: 'T',
                threads: 7
            })
        );
        assert_eq!(look_at(b"garbage"), None);
        assert_eq!(
            look_at(b"42 (cut) R 1 42"),
            None,
            "a line cut short says nothing"
        );
    }

    #[test]
    fn only_a_multi_threaded_task_not_yet_stopped_can_still_run_its_code() {
        let can_run = |state, threads| !Look { state, threads }.cannot_run();
        // Its SIGSTOP is pending, and it takes it before its next instruction.
        assert!(!can_run('R', 1));
        assert!(!can_run('S', 1));
        // Stopped, dead, or a zombie.
        assert!(!can_run('T', 8));
        assert!(!can_run('Z', 1));
        // The thread woken for the signal has not taken it: the others still run.
        assert!(can_run('R', 2));
        assert!(can_run('S', 4));
        assert!(can_run('D', 2));
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

    /// Looks until the task's state is `T`, for a test to see a stop the NM need not wait for.
    fn until_stopped(states: &mut TaskStates, pid: i32) -> Look {
        for _ in 0..5000 {
            match states.look(pid) {
                Some(look) if look.state == 'T' => return look,
                _ => std::thread::sleep(Duration::from_millis(1)),
            }
        }
        panic!("process {pid} never stopped");
    }

    /// A single-threaded task is not waited for: its SIGSTOP is pending from the moment
    /// kill(2) returns. It stops all the same, and once reaped it is gone and its file closed.
    #[test]
    fn a_single_threaded_task_is_not_waited_for_and_a_reaped_one_is_gone() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = child.id() as i32;
        let mut states = TaskStates::default();
        // Running, sleeping, or in disk wait while it execs.
        let look = states.look(pid).unwrap();
        assert!(matches!(look.state, 'R' | 'S' | 'D'), "{look:?}");
        kill(Pid::from_raw(pid), Signal::SIGSTOP).unwrap();
        assert!(states.wait_until_stopped(&[pid], Duration::from_secs(5)));
        assert_eq!(
            states.sleeps(),
            0,
            "the NM slept waiting for a single-threaded task"
        );
        assert_eq!(until_stopped(&mut states, pid).threads, 1);
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(states.look(pid), None);
        assert!(states.files.is_empty(), "the file of a gone task is closed");
    }

    /// A multi-threaded task is waited for until it has stopped: its other threads run on
    /// until the one the kernel woke for the SIGSTOP has taken it. The task here is a C
    /// program (the C compiler builds it) whose main thread sleeps in pause(2) while a second
    /// thread spins.
    #[test]
    fn a_multi_threaded_task_is_waited_for_until_it_has_stopped() {
        let dir = tempfile::tempdir().unwrap();
        let (src, bin) = (dir.path().join("threads.c"), dir.path().join("threads"));
        std::fs::write(
            &src,
            "#include <pthread.h>\n#include <unistd.h>\n\
             static void *spin(void *a) { for (volatile long i = 0;; i++) ; return a; }\n\
             int main(void) { pthread_t t; pthread_create(&t, 0, spin, 0); for (;;) pause(); }\n",
        )
        .unwrap();
        let built = std::process::Command::new("cc")
            .args(["-O1", "-pthread", "-o"])
            .arg(&bin)
            .arg(&src)
            .status();
        if !matches!(built, Ok(s) if s.success()) {
            eprintln!(
                "NOT TESTED: a_multi_threaded_task_is_waited_for_until_it_has_stopped: no C \
                 compiler (cc) to build its test program ({built:?})"
            );
            return;
        }
        let mut child = std::process::Command::new(&bin).spawn().unwrap();
        let pid = child.id() as i32;
        let mut states = TaskStates::default();
        while states.look(pid).is_some_and(|l| l.threads < 2) {
            std::thread::sleep(Duration::from_millis(1));
        }
        kill(Pid::from_raw(pid), Signal::SIGSTOP).unwrap();
        assert!(states.wait_until_stopped(&[pid], Duration::from_secs(5)));
        let look = states.look(pid).unwrap();
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(
            look,
            Look {
                state: 'T',
                threads: 2
            },
            "the wait ended before the multi-threaded task had stopped"
        );
    }
}
