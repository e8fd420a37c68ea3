//! A local user against the machine manager's availability (issue 61): root daemons on
//! loopback, the attacker an unprivileged user (`nobody`) on the MM's host, and what every
//! other user sees afterwards: whether the MM still answers, takes and runs their jobs.
//!
//! * H1: a user changes the program of a job that waits (grows it while its copy beside the
//!   journal is made). The MM ends that job, saying why, and goes on.
//! * M1: a user opens control connections and never greets the MM: each is dropped at the
//!   greeting's deadline, and no more of them are held at once than the user's connection
//!   limit, so other users' commands keep working.
//! * M4: a user queues jobs with the largest environment allowed: the bytes one user may hold
//!   in waiting requests are bounded, the refusal names the limit, and what was accepted
//!   before is untouched.

mod support;

use std::os::unix::process::CommandExt;
use std::process::Command;
use std::time::{Duration, Instant};

use support::{NOBODY, TestCluster, text};

/// A shell script of about `bytes` bytes (padded with a comment) that prints `marker`.
fn padded_script(path: &std::path::Path, bytes: usize, marker: &str) {
    use std::os::unix::fs::PermissionsExt;
    let mut body = format!("#!/bin/sh\necho {marker}\nexit 0\n");
    let line = format!("# {}\n", "x".repeat(1000));
    while body.len() < bytes {
        body.push_str(&line);
    }
    std::fs::write(path, body).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// Waits until `storm queue` lists job `job` as running.
fn wait_running(c: &TestCluster, job: &str) -> bool {
    let until = Instant::now() + Duration::from_secs(20);
    while Instant::now() < until {
        let q = text(&c.storm(&["queue"]).stdout);
        if q.lines()
            .any(|l| l.split_whitespace().next() == Some(job) && l.contains("running"))
        {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

/// H1. A job that must wait is submitted with its program sent along (`--bcast`), and its
/// owner appends to the program right after (a rebuild, or on purpose) while the MM copies it
/// beside the journal. The copy finds the size changed and the MM ends the job with that
/// reason. On the code before issue 61 it dropped the job from its table but not from the
/// policy's queue, and the moment the job ahead ended it panicked starting the dropped job
/// (8 of 8 tries): every user's jobs and commands were gone. Now the job ahead ends, the MM
/// answers, and another user's next job runs.
#[test]
fn a_user_who_changes_a_waiting_jobs_program_does_not_crash_the_mm() {
    let test = "a_user_who_changes_a_waiting_jobs_program_does_not_crash_the_mm";
    if !support::root_or_say(test) {
        return;
    }
    let c = TestCluster::start(1);
    let work = support::shared_tempdir();
    let submit = env!("CARGO_BIN_EXE_storm-submit");
    let mut changed = None;
    // The append must land while the copy is made; the delay after submitting is swept.
    for (attempt, delay_ms) in [0u64, 2, 5, 10, 20, 40, 80].into_iter().enumerate() {
        let mut ahead = c.spawn(&["--exclusive", "sleep", "3"]);
        let ahead_id = {
            let until = Instant::now() + Duration::from_secs(10);
            let mut id = None;
            while id.is_none() && Instant::now() < until {
                let q = text(&c.storm(&["queue"]).stdout);
                id = q
                    .lines()
                    .skip(1)
                    .find(|l| l.contains("running"))
                    .and_then(|l| l.split_whitespace().next().map(str::to_string));
                std::thread::sleep(Duration::from_millis(20));
            }
            id.expect("the job ahead runs")
        };
        assert!(wait_running(&c, &ahead_id));
        let prog = work.path().join(format!("prog{attempt}.sh"));
        padded_script(&prog, 48 << 20, "ran");
        std::os::unix::fs::chown(&prog, Some(NOBODY), Some(NOBODY)).unwrap();
        // The user: submits, then changes the program while the job waits.
        let attacker = format!(
            "{submit} --socket '{}' --bcast '{}' & sleep {}; printf '# more\\n' >> '{}'; wait $!",
            c.socket.display(),
            prog.display(),
            delay_ms as f64 / 1000.0,
            prog.display()
        );
        let out = Command::new("sh")
            .args(["-c", &attacker])
            .uid(NOBODY)
            .gid(NOBODY)
            .output()
            .unwrap();
        let said = format!("{}{}", text(&out.stdout), text(&out.stderr));
        let _ = ahead.wait();
        // The job ahead has ended, and the policy has made its next decision.
        std::thread::sleep(Duration::from_millis(200));
        let alive = c.storm(&["queue"]);
        assert!(
            alive.status.success(),
            "the MM stopped answering after a user changed a waiting job's program \
             (attempt {attempt}, {delay_ms} ms after submitting): {}\nthe user saw: {said}",
            text(&alive.stderr)
        );
        if said.contains("changed after it was submitted") {
            assert!(!out.status.success(), "the changed job reports a failure");
            changed = Some(said);
            break;
        }
        assert!(
            said.contains("ran") && out.status.success(),
            "the job whose program was not caught changing runs: {said}"
        );
    }
    let said = changed
        .expect("no append landed while the MM copied the program: the attack was not exercised");
    // Another user's job runs.
    let out = c.submit(&["-N", "1", "echo", "still-here"]);
    assert!(
        out.status.success() && text(&out.stdout).contains("still-here"),
        "after {said}: {}",
        text(&out.stderr)
    );
}

/// Threads of process `pid`, read from outside.
fn threads(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task")).map_or(0, |d| d.count())
}

/// Runs `f` on a thread whose credentials are `nobody`'s (the kernel takes a Unix socket's
/// peer credentials from the thread that connects).
fn as_nobody<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    std::thread::spawn(move || {
        let id = NOBODY as libc::c_long;
        // SAFETY: plain syscalls with integer arguments; they change this thread only.
        let (g, u) = unsafe {
            (
                libc::syscall(libc::SYS_setresgid, id, id, id),
                libc::syscall(libc::SYS_setresuid, id, id, id),
            )
        };
        assert_eq!((g, u), (0, 0), "{}", std::io::Error::last_os_error());
        f()
    })
    .join()
    .unwrap()
}

/// M1. A user opens five times their connection limit of control connections and says
/// nothing on them. Before issue 61 the MM kept a thread for each, forever (600 of them gave
/// it 600 threads, and at its descriptor limit every other user was refused). Now what has
/// not greeted counts against the user's connection limit by the kernel's word for who they
/// are: the MM holds at most that many for them, refuses the rest at once, drops the silent
/// ones at the greeting deadline (5 s), and answers everyone else meanwhile.
#[test]
fn a_user_who_never_greets_the_mm_holds_no_more_than_their_connection_limit() {
    use std::io::Read;
    use std::os::unix::net::UnixStream;
    let test = "a_user_who_never_greets_the_mm_holds_no_more_than_their_connection_limit";
    if !support::root_or_say(test) {
        return;
    }
    let limit = 8usize;
    let c = TestCluster::with(storm_cli::local::LocalOptions {
        cpus: Some(support::TEST_CPUS),
        limits: storm_cluster::config::LimitsSection {
            max_connections_per_user: limit as u32,
            ..Default::default()
        },
        ..storm_cli::local::LocalOptions::new(1)
    });
    let mm = c.daemon_pid("storm-mm");
    let before = threads(mm);
    let socket = c.socket.clone();
    let silent: Vec<UnixStream> = as_nobody(move || {
        (0..5 * limit)
            .map(|_| UnixStream::connect(&socket).expect("connect"))
            .collect()
    });
    std::thread::sleep(Duration::from_millis(500));
    let during = threads(mm);
    assert!(
        during <= before + limit + 2,
        "{} silent connections of one user gave the MM {} threads more (limit {limit})",
        silent.len(),
        during - before
    );
    // Everyone else is answered meanwhile, nobody's own commands too once theirs are gone.
    let q = c.storm(&["queue"]);
    assert!(q.status.success(), "root's queue: {}", text(&q.stderr));
    let out = c.submit_as(1 /* daemon */, &["true"]);
    assert!(
        out.status.success(),
        "another user's job: {}",
        text(&out.stderr)
    );
    // Past the deadline, the MM has closed every one of them.
    std::thread::sleep(Duration::from_secs(6));
    for (i, mut s) in silent.into_iter().enumerate() {
        s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let mut buf = [0u8; 4096];
        let mut end = false;
        for _ in 0..16 {
            match s.read(&mut buf) {
                // A refusal's reason may come first.
                Ok(n) if n > 0 => continue,
                Ok(_) => {
                    end = true;
                    break;
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(_) => {
                    end = true;
                    break;
                }
            }
        }
        assert!(
            end,
            "silent connection {i} is still open 6 s after it was made"
        );
    }
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        threads(mm) <= before + 1,
        "the MM keeps {} threads more after the silent connections went",
        threads(mm) - before
    );
    let out = c.submit_as(NOBODY, &["true"]);
    assert!(
        out.status.success(),
        "nobody's own job afterwards: {}",
        text(&out.stderr)
    );
}

/// M4. A user queues jobs with as much environment as one job may carry. Before issue 61
/// nothing bounded the sum: 600 queued jobs of 2 MB each gave the MM 2.19 GiB of memory and
/// 1.2 GiB of journal, within every default. Now the bytes of arguments and environment held
/// for one user's unfinished jobs are bounded (`[limits] max_held_request_bytes_per_user`):
/// past it a submission is refused with the limit's name, what was accepted waits on
/// untouched and runs, and another user submits as before.
#[test]
fn a_user_cannot_hold_more_than_their_bytes_of_queued_requests() {
    let test = "a_user_cannot_hold_more_than_their_bytes_of_queued_requests";
    if !support::root_or_say(test) {
        return;
    }
    let c = TestCluster::with(storm_cli::local::LocalOptions {
        cpus: Some(1),
        limits: storm_cluster::config::LimitsSection {
            max_held_request_bytes_per_user: 4 << 20,
            ..Default::default()
        },
        ..storm_cli::local::LocalOptions::new(1)
    });
    let blocker = c.spawn(&["--exclusive", "/bin/sleep", "300"]);
    let since = Instant::now();
    while !text(&c.storm(&["queue"]).stdout).contains("running") {
        assert!(since.elapsed() < Duration::from_secs(30), "no job started");
        std::thread::sleep(Duration::from_millis(20));
    }
    // Eight variables of 120 KB (one string may not pass 128 KiB at exec): about 0.96 MB
    // a job, so four fit under 4 MiB and the next do not.
    let value = "v".repeat(120_000);
    let submit = |i: usize| {
        let mut cmd = c.submit_cmd_as(NOBODY, &["/bin/true"]);
        for k in 0..8 {
            cmd.env(format!("BIG{k}"), &value);
        }
        cmd.env("WHICH", i.to_string())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    let mut waiting = Vec::new();
    let mut refused = Vec::new();
    for i in 0..7 {
        let mut child = submit(i);
        // Refused at once, or accepted and waiting (listed in the queue).
        let until = Instant::now() + Duration::from_secs(20);
        loop {
            if child.try_wait().unwrap().is_some() {
                refused.push(text(&child.wait_with_output().unwrap().stderr));
                break;
            }
            let listed = text(&c.storm(&["queue"]).stdout)
                .lines()
                .filter(|l| l.contains("queued"))
                .count();
            if listed > waiting.len() {
                waiting.push(child);
                break;
            }
            assert!(
                Instant::now() < until,
                "submission {i} neither waits nor is refused"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    assert_eq!(
        waiting.len(),
        4,
        "jobs of 0.96 MB each accepted under a 4 MiB per-user bound (refused: {refused:?})"
    );
    for e in &refused {
        assert!(
            e.contains("max_held_request_bytes_per_user"),
            "a refusal does not name the limit: {e}"
        );
    }
    // Another user is not bound by nobody's bytes.
    let mut other = c.submit_cmd_as(1, &["/bin/true"]);
    other.env("BIG", &value);
    let other = other
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // What was accepted runs once the node frees.
    std::thread::sleep(Duration::from_millis(300));
    let cancel = c.storm(&["cancel", "1"]);
    assert!(cancel.status.success(), "{}", text(&cancel.stderr));
    blocker.wait_with_output().unwrap();
    for child in waiting.into_iter().chain([other]) {
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "an accepted job did not run: {}",
            text(&out.stderr)
        );
    }
}
