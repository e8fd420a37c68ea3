//! Whether a stopped task is off the CPU: its state and thread count in /proc/PID/stat.
//!
//! Gang scheduling stops the old slot's tasks before it continues the new slot's, so that a
//! node never runs two slots at once. A switch is complete only when the old slot is off the
//! CPU, which a task can observe: from the moment the switch completes, its clock shows no
//! more time on a CPU (storm_cli::run_windows measures exactly that). /proc says so by the
//! task's state:
//!
//! * `R` (running, or waiting for a CPU) is never off the CPU, even with its SIGSTOP pending:
//!   it is still on a run queue, and it takes the CPU it is given (counting such a task as
//!   stopped, as this module once did, let the new slot be continued while the old one still
//!   held the CPU it needed to take its stop);
//! * `T`/`t` (stopped), `Z`/`X` (ended) are off the CPU;
//! * `S`/`D` (asleep) is off the CPU for a single-threaded task: waking, it takes its pending
//!   SIGSTOP before it returns to its own code. A multi-threaded one is waited for until it
//!   shows `T`: its other threads may be running.
//!
//! What is looked at is the task's own process, the leader of its process group; other
//! processes of the group (a shell's children) were sent the same SIGSTOP and are not looked
//! at.
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
    /// The task is off the CPU and runs none of its own code before it is continued: it has
    /// stopped or ended, or it is single-threaded and asleep (see the module's overview).
    pub fn off_cpu(self) -> bool {
        match self.state {
            'R' => false,
            'S' | 'D' => self.threads <= 1,
            _ => true,
        }
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

    /// Waits until every one of `pids`, each sent SIGSTOP, is off the CPU (see the module's
    /// overview); false if `limit` passed first.
    pub fn wait_until_stopped(&mut self, pids: &[i32], limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        // A task acts on SIGSTOP only once it gets a CPU, so leave the CPU to it: sleep between
        // looks rather than poll at full speed (or yield, which a busy NM would return from at
        // once). The first sleep is as long as stops lately took; the later ones start short
        // and double.
        let mut pause = self.first_pause;
        let mut sleeps = 0;
        for &pid in pids {
            while let Some(look) = self.look(pid) {
                if look.off_cpu() {
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
    fn a_task_is_off_the_cpu_only_once_it_no_longer_waits_for_one() {
        let off = |state, threads| Look { state, threads }.off_cpu();
        // On a run queue, whatever is pending for it.
        assert!(!off('R', 1));
        assert!(!off('R', 2));
        // Asleep and single-threaded: it takes its pending SIGSTOP on waking.
        assert!(off('S', 1));
        assert!(off('D', 1));
        // Stopped, dead, or a zombie.
        assert!(off('T', 8));
        assert!(off('Z', 1));
        // The thread woken for the signal has not taken it: the others may still run.
        assert!(!off('S', 4));
        assert!(!off('D', 2));
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

    /// Looks until the task's state is `T`.
    fn until_stopped(states: &mut TaskStates, pid: i32) -> Look {
        for _ in 0..5000 {
            match states.look(pid) {
                Some(look) if look.state == 'T' => return look,
                _ => std::thread::sleep(Duration::from_millis(1)),
            }
        }
        panic!("process {pid} never stopped");
    }

    /// The user time of process `pid` so far, in clock ticks (`utime` in /proc/PID/stat).
    fn user_ticks(pid: i32) -> u64 {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let after = stat.rsplit_once(')').map_or("", |(_, a)| a);
        // Fields after the command: the state is the first, utime the twelfth.
        after
            .split_whitespace()
            .nth(11)
            .and_then(|t| t.parse().ok())
            .unwrap_or(0)
    }

    /// A single-threaded task on a CPU is waited for until it is off it: a SIGSTOP pending in
    /// a task that is still runnable leaves it on a run queue. Once the wait returns the task
    /// is stopped (it is never seen runnable again), and once reaped it is gone and its file
    /// closed.
    #[test]
    fn a_running_task_is_waited_for_until_it_is_off_the_cpu_and_a_reaped_one_is_gone() {
        let mut child = std::process::Command::new("sh")
            .args(["-c", "while :; do :; done"])
            .spawn()
            .unwrap();
        let pid = child.id() as i32;
        let mut states = TaskStates::default();
        // Running its loop, not still starting: a shell just forked may sleep in D while its
        // pages are read in (on a loaded host), and the wait rightly counts a sleeping task
        // as off the CPU, though it shows R for a moment as it wakes to take the SIGSTOP.
        for _ in 0..5000 {
            if user_ticks(pid) >= 5 && states.look(pid).is_some_and(|l| l.state == 'R') {
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        kill(Pid::from_raw(pid), Signal::SIGSTOP).unwrap();
        assert!(states.wait_until_stopped(&[pid], Duration::from_secs(5)));
        for _ in 0..100 {
            let look = states.look(pid).unwrap();
            assert!(look.off_cpu(), "seen on a CPU after the wait: {look:?}");
        }
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
