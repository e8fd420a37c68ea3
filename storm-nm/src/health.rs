//! The site's health program (`[health] program`, as Slurm's `HealthCheckProgram`): a thread
//! of its own runs it every `program_every_ms`, and the sampling thread puts its last verdict
//! into the node's health record (`storm_cluster::health`) with the other checks.
//!
//! The program runs as the NM's user (root), with `STORM_NODE` set to the node's name, in a
//! process group of its own. Exit status 0 is healthy. Anything else is sick, and the first
//! line it printed (standard output, else standard error) is the reason. A run past
//! `program_timeout_ms` is killed, group and all, and the node is sick for that. A program
//! that cannot be started makes the node sick as well: a health check the site asked for and
//! cannot have is not a healthy node.

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Bytes of the program's output kept (the rest is read and dropped).
const OUTPUT_KEPT: usize = 4096;

/// The program's thread; dropped, it stops (a run under way finishes or times out first).
pub struct HealthProgram {
    verdict: Arc<Mutex<Option<String>>>,
    stop: Option<mpsc::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl HealthProgram {
    /// Runs `program` now and then every `every`, on node `node`.
    pub fn start(
        program: PathBuf,
        every: Duration,
        timeout: Duration,
        node: String,
    ) -> std::io::Result<Self> {
        let verdict = Arc::new(Mutex::new(None));
        let (stop, stopped) = mpsc::channel::<()>();
        let shared = verdict.clone();
        let thread = std::thread::Builder::new()
            .name("storm-health".into())
            .spawn(move || {
                loop {
                    let v = run_once(&program, timeout, &node);
                    if let Some(reason) = &v {
                        tracing::warn!("health program: node sick: {reason}");
                    }
                    *shared.lock().unwrap_or_else(|p| p.into_inner()) = v;
                    match stopped.recv_timeout(every) {
                        Err(mpsc::RecvTimeoutError::Timeout) => {}
                        Ok(()) | Err(mpsc::RecvTimeoutError::Disconnected) => return,
                    }
                }
            })?;
        Ok(Self {
            verdict,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// The last run's verdict: why the node is sick, or `None` (healthy, or no run yet).
    pub fn verdict(&self) -> Option<String> {
        self.verdict
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

impl Drop for HealthProgram {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Runs `program` once: `None` if it says the node is healthy, else why not.
pub fn run_once(program: &Path, timeout: Duration, node: &str) -> Option<String> {
    let name = program.display();
    let spawn = || {
        Command::new(program)
            .env("STORM_NODE", node)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .spawn()
    };
    // A program just written is briefly busy (ETXTBSY) while a process forked meanwhile
    // still holds its descriptor: tried again a few times before it counts as not running.
    let mut spawned = spawn();
    for _ in 0..20 {
        match &spawned {
            Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) => {
                std::thread::sleep(Duration::from_millis(10));
                spawned = spawn();
            }
            _ => break,
        }
    }
    let mut child = match spawned {
        Ok(c) => c,
        Err(e) => return Some(format!("health program {name} cannot run: {e}")),
    };
    let readers = [
        child.stdout.take().map(|o| read_bounded(Box::new(o))),
        child.stderr.take().map(|e| read_bounded(Box::new(e))),
    ];
    let deadline = Instant::now() + timeout;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
            Ok(None) | Err(_) => break None,
        }
    };
    let Some(status) = status else {
        // The whole group: a script's children must not outlive it holding the pipes.
        let _ = nix::sys::signal::killpg(
            nix::unistd::Pid::from_raw(child.id() as i32),
            nix::sys::signal::Signal::SIGKILL,
        );
        let _ = child.wait();
        return Some(format!(
            "health program {name} did not finish within {} ms",
            timeout.as_millis()
        ));
    };
    if status.success() {
        return None;
    }
    let said = readers
        .into_iter()
        .flatten()
        .filter_map(|r| r.join().ok())
        .find_map(|text| {
            text.lines()
                .map(str::trim)
                .find(|l| !l.is_empty())
                .map(str::to_string)
        });
    Some(match said {
        Some(line) => line,
        None => format!("health program {name} failed ({status})"),
    })
}

/// A thread that reads `from` to its end, keeping the first [`OUTPUT_KEPT`] bytes.
fn read_bounded(mut from: Box<dyn Read + Send>) -> JoinHandle<String> {
    std::thread::spawn(move || {
        let mut kept = Vec::new();
        let mut buf = [0u8; 4096];
        while let Ok(n) = from.read(&mut buf) {
            if n == 0 {
                break;
            }
            let room = OUTPUT_KEPT.saturating_sub(kept.len());
            kept.extend_from_slice(&buf[..n.min(room)]);
        }
        String::from_utf8_lossy(&kept).into_owned()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn script(dir: &Path, body: &str) -> PathBuf {
        let p = dir.join("check");
        std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        p
    }

    #[test]
    fn the_programs_verdict_and_reason() {
        let dir = tempfile::tempdir().unwrap();
        let t = Duration::from_secs(5);
        let ok = script(dir.path(), "echo fine; exit 0");
        assert_eq!(run_once(&ok, t, "n1"), None);
        let sick = script(
            dir.path(),
            "echo; echo \"$STORM_NODE: fan 3 stopped\"; echo more; exit 2",
        );
        assert_eq!(
            run_once(&sick, t, "n1").as_deref(),
            Some("n1: fan 3 stopped")
        );
        let quiet = script(dir.path(), "exit 1");
        let reason = run_once(&quiet, t, "n1").unwrap();
        assert!(reason.contains("failed (exit status: 1)"), "{reason}");
        let gone = dir.path().join("missing");
        let reason = run_once(&gone, t, "n1").unwrap();
        assert!(reason.contains("cannot run"), "{reason}");
    }

    #[test]
    fn a_program_that_hangs_is_killed_with_its_children() {
        let dir = tempfile::tempdir().unwrap();
        let pidfile = dir.path().join("child.pid");
        let hang = script(
            dir.path(),
            &format!("sleep 300 & echo $! > {}; wait", pidfile.display()),
        );
        let reason = run_once(&hang, Duration::from_millis(300), "n1").unwrap();
        assert!(reason.contains("did not finish within 300 ms"), "{reason}");
        let pid: i32 = std::fs::read_to_string(&pidfile)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        // The background child was killed with the group (gone, or a zombie until reaped);
        // a SIGKILL takes effect at once, but its exit may take the kernel a moment.
        let alive = || {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .map(|s| !s.contains(") Z "))
                .unwrap_or(false)
        };
        let until = Instant::now() + Duration::from_secs(5);
        while alive() && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(!alive(), "the program's child {pid} outlived it");
    }
}
