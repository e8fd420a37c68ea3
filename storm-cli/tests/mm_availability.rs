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
